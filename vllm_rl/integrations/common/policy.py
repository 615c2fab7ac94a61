"""Per-sample flags for verl's rollouts: the policy object the agent loop asks.

verl runs ``rollout.n`` samples of every prompt as separate requests; the agent loop
(:mod:`.agent_loop`) describes each one as a :class:`Sample` and asks the policy for its
``vllm_rl`` flags.  :class:`StaticPolicy` (the default) sends the flags written under
``rollout.engine_kwargs.vllm_rl.flags`` and fills in what only the loop knows:

* ``group``: ``id`` = verl's ``uid`` (one per prompt per step), ``redundant`` = M' =
  ``rollout.n``, ``size`` = M (``flags.group.size``, default M');
* ``das.problem_id`` = ``"{data_source}:{index}"`` from the dataset row, stable across
  steps (verl's ``uid`` is not), when the engine has a DAS drafter;
* nothing at all for validation samples (they run as on stock vLLM).

A policy of your own (``rollout.engine_kwargs.vllm_rl.policy: pkg.module.Class``) is
built as ``Class(settings)`` in each agent-loop worker and may vary the flags per
problem, e.g. DUET's K1/K2 or ARRoL's ``l_detect`` from the controllers of
the technique folders (``vllm_rl.duet.controller``, ``vllm_rl.arrol.controller``).  verl repeats each prompt exactly ``rollout.n`` times before the
agent loop runs, so a per-prompt sample count (DARTS Alg. 1, DUET's Neyman allocation)
cannot be expressed through the flags: it needs verl's batch to be built per prompt.
"""
from __future__ import annotations

import abc
import copy
import importlib
from dataclasses import dataclass
from typing import Any

from vllm_rl.flags import KEY, read


@dataclass(frozen=True)
class Sample:
    """What the agent loop knows of one sample before it runs."""

    uid: str                  # verl's group id for this prompt, this step
    n: int                    # M': samples of this prompt in the step (rollout.n)
    problem_id: str | None    # stable across steps ("{data_source}:{index}")
    validate: bool = False

    @classmethod
    def of(cls, kwargs: dict[str, Any], n: int) -> "Sample":
        extra = kwargs.get("extra_info") or {}
        index = kwargs.get("index", extra.get("index") if isinstance(extra, dict) else None)
        source = kwargs.get("data_source")
        problem = None if index is None else (f"{source}:{index}" if source else str(index))
        return cls(uid=str(kwargs.get("uid") or ""), n=int(n), problem_id=problem,
                   validate=bool(kwargs.get("validate", False)))


class RolloutPolicy(abc.ABC):
    """Gives each sample its ``vllm_rl`` flags (a dict in :func:`vllm_rl.rl_params` form),
    or None to run it as on stock vLLM."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings

    @abc.abstractmethod
    def flags(self, sample: Sample) -> dict[str, Any] | None:
        """The flags of ``sample``."""


class StaticPolicy(RolloutPolicy):
    """The configured flags for every training sample, with group and problem filled in."""

    def __init__(self, settings: dict[str, Any]) -> None:
        super().__init__(settings)
        self.base = copy.deepcopy(settings.get("flags") or {})
        self.das = bool(settings.get("das"))
        if not self.das and "das" in self.base:
            raise ValueError("rollout.engine_kwargs.vllm_rl.flags.das needs the engine's "
                             "drafter: set rollout.engine_kwargs.vllm_rl.das")
        if self.base:
            read({KEY: {**self.base, "group": {**self.base.get("group", {}), "id": "check"}}})

    def flags(self, sample: Sample) -> dict[str, Any] | None:
        if sample.validate or not (self.base or self.das) or not sample.uid:
            return None
        out = copy.deepcopy(self.base)
        group = out.setdefault("group", {})
        group["id"] = sample.uid
        group["redundant"] = sample.n
        group.setdefault("size", sample.n)
        if self.das:
            das = out.setdefault("das", {})
            if sample.problem_id is not None:
                das.setdefault("problem_id", sample.problem_id)
        return out


def load_policy(settings: dict[str, Any]) -> RolloutPolicy:
    """``settings["policy"]`` (a class path) built with the settings, else StaticPolicy."""
    path = settings.get("policy")
    if not path:
        return StaticPolicy(settings)
    module, _, name = str(path).rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, RolloutPolicy)):
        raise TypeError(f"rollout.engine_kwargs.vllm_rl.policy={path!r}: not a RolloutPolicy")
    return cls(settings)
