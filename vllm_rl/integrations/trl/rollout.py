"""TRL's ``rollout_func`` on the RL engine in the same process, and the records in the loss.

``GRPOTrainer(rollout_func=RolloutFunc(llm, flags), ...)``: TRL hands the function a
generation batch in which each prompt appears ``num_generations`` (= M) times in a row;
the function

1. loads the trainer's current weights into the engine when the step changed
   (:meth:`vllm_rl.LLM.load_weights`: vLLM's ``reload_weights``; the DAS trees, ARRoL
   head and DUET thresholds stay),
2. sends each distinct prompt once with ``n`` = M′ and the group's flags
   (``group.size`` = M, ``das.problem_id`` from ``problem_id(prompt)``).  With DARTS,
   M′ and the sampling mode come per prompt from a
   :class:`~vllm_rl.darts.controller.DartsPlanner` (Alg. 1 and Alg. 2: dual-end
   unless the allocation saturates), unless ``redundant`` fixes one M′ for all,
3. returns M completions per prompt with the real tokens and log-probs, in this order:
   the training group, then the samples whose reward only counts in the group baseline
   (DUET's aborted ones, Alg. A.10 l.38), then the others; per sample
   (:func:`vllm_rl.integrations.common.marks.training_marks`):

   * ``env_mask``: TRL multiplies it into the loss mask; all ones for a sample in the
     loss, all zeros for one that is not;
   * ``vllm_rl_weight``: the loss weight (0 out of the loss, 1/ε for DUET's ε-kept):
     :class:`~vllm_rl.integrations.trl.trainer.RLGRPOTrainer` multiplies the advantages
     by it;
   * ``vllm_rl_baseline``: 1 if the reward counts in the group baseline:
     :func:`masked_reward` makes TRL's reward ``None`` where it is 0, so TRL leaves the
     sample out of its group mean and std;
   * ``vllm_rl_record``: the :class:`~vllm_rl.outcome.RolloutInfo` wire string,

4. with ARRoL and a ``reward`` function, trains the quality head between steps
   (:class:`~vllm_rl.arrol.controller.ArrolFeedback` on every sample of the
   step, the M′ − M left out included) and pushes it to the engine,
5. with ``regime_log`` (a path), appends the step's samples to it, with their rewards
   where ``reward`` is given: what ``vllm-rl advise`` reads (:mod:`vllm_rl.regime_log`).

:attr:`RolloutFunc.last` keeps the last step's records (for DUET's thresholds, the
figures); DUET's K1/K2 are the engine's own online estimate unless the flags fix them.
"""
from __future__ import annotations

import copy
import hashlib
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from vllm import SamplingParams

from vllm_rl.integrations.common.marks import TrainingMark, training_marks
from vllm_rl.integrations.common.partial import (CarryBuffer, Part, PartialConfig, part_of,
                                                 staleness)
from vllm_rl.cost.trainer import TrainedBatch
from vllm_rl.outcome import RolloutInfo

RECORD = "vllm_rl_record"
WEIGHT = "vllm_rl_weight"
BASELINE = "vllm_rl_baseline"


def default_problem_id(prompt: str) -> str:
    return "p:" + hashlib.blake2b(prompt.encode(), digest_size=8).hexdigest()


@dataclass
class Rollout:
    """One step's rollout as the engine returned it (every sample, not only the M)."""

    prompts: list[str] = field(default_factory=list)
    infos: list[list[RolloutInfo]] = field(default_factory=list)     # per prompt, all M′
    marks: list[list[TrainingMark]] = field(default_factory=list)    # per prompt, all M′
    texts: list[list[str]] = field(default_factory=list)
    redundant: list[int] = field(default_factory=list)               # M′ per prompt
    flags: list[dict | None] = field(default_factory=list)           # the flags it ran with
    rows: list[Any] = field(default_factory=list)                    # the trainer's input rows
    generated_tokens: int = 0
    wall_s: float = 0.0
    carried: int = 0                # partial rollouts: samples carried out of this step
    staleness: dict[str, float] = field(default_factory=dict)   # of the groups it returns
    trained: TrainedBatch | None = None     # the rows the trainer gets (padding rows too)


class RolloutFunc:
    """TRL ``rollout_func(prompts, trainer)`` on a :class:`vllm_rl.LLM` (module docstring).

    ``redundant``: one M′ for every prompt, or None (DARTS: the planner's per-prompt M′;
    otherwise M′ = M).  ``planner``: a :class:`DartsPlanner` (made with M when DARTS is
    on and neither is given).  ``arrol_feedback`` + ``reward(prompt, text)``: train and
    push ARRoL's head after every step.
    """

    def __init__(self, llm, flags: dict[str, Any] | None = None, *, redundant: int | None = None,
                 max_tokens: int = 256, temperature: float = 1.0, seed: int = 0,
                 problem_id: Callable[[str], str] = default_problem_id,
                 sync_weights: bool = True, planner=None, arrol_feedback=None,
                 reward: Callable[[str, str], float] | None = None,
                 duet_allocation: Any = "auto", duet_budget: float = 1.0,
                 partial: PartialConfig | dict | bool | None = None,
                 keep_prompt: Callable[[Any], bool] | None = None,
                 regime_log: Any = None) -> None:
        self.llm, self.flags = llm, copy.deepcopy(flags) if flags else None
        self.redundant, self.max_tokens, self.temperature = redundant, max_tokens, temperature
        self.seed, self.problem_id, self.sync_weights = seed, problem_id, sync_weights
        self.planner = planner
        self.arrol_feedback, self.reward = arrol_feedback, reward
        if arrol_feedback is not None and reward is None:
            raise ValueError("RolloutFunc(arrol_feedback=...) needs reward=(prompt, text) -> float")
        self.duet_allocation, self.duet_budget = duet_allocation, float(duet_budget)
        self._seen: set = set()                 # prompt ids allocated so far (DUET's epoch)
        self._strata: dict = {}                 # this step's s_pre per prompt id (DUET)
        self.partial = PartialConfig.of(partial)
        self.buffer = CarryBuffer()
        self.keep_prompt = keep_prompt          # a carried group's prompt still in the data?
        self.regime_log = regime_log            # a path: each step's samples for `advise`
        self._regime_log = None
        self.loaded_step: int | None = None
        self.weight_version: int | None = None  # the engine's after the last load
        self.calls = 0
        self._groups: list[tuple[list[int], list[Part]]] = []   # per prompt: ids, samples
        self._logprob_sums: list[float] = []
        self._prepared: tuple[list, dict] | None = None   # (prompts, rows): prepare()'s
        self.last = Rollout()
        self.last_weights: list[float] = []     # per returned sample, in TRL's order
        self.last_arrol_update: dict | None = None   # the head last pushed to the engine
        self.last_marks: list[TrainingMark] = []
        self.last_texts: list[str] = []

    def _darts_planner(self, m: int):
        if self.planner is None and self.redundant is None:
            from vllm_rl.darts.controller import DartsPlanner

            self.planner = DartsPlanner(m, max_tokens=self.max_tokens)
        return self.planner if self.redundant is None else None

    def _duet_allocator(self, m: int):
        """DUET's allocator (Thm. 1 / Eq. 4, :class:`~vllm_rl.duet.controller.
        DuetController`) where DUET runs without DARTS and M' is not fixed: made with
        n in [2, 2M] at the first step (``duet_allocation="auto"``), or the one given;
        None: every prompt gets M."""
        flags = self.flags or {}
        if (self.duet_allocation is None or "duet" not in flags or "darts" in flags
                or self.redundant is not None):
            return None
        if self.duet_allocation == "auto":
            from vllm_rl.duet.controller import DuetController

            self.duet_allocation = DuetController(self.max_tokens / 2, n_max=2 * m)
        return self.duet_allocation

    def _allocate(self, ids: list, m: int) -> list[int] | None:
        """Alg. A.10 Phase 1: n_q per prompt for the budget B = ``duet_budget`` × M ×
        Σ_q L̂_q (the token cost of M rollouts each; 1.0: the paper's full budget), and
        the stratification factors s_pre for Eq. 6's weights; s_floor frozen at the first
        step that repeats a prompt (the end of the first epoch, App. A.3)."""
        alloc = self._duet_allocator(m)
        if alloc is None:
            self._strata = {}
            return None
        if self._seen.intersection(ids):
            alloc.end_epoch()
        self._seen.update(ids)
        counts = alloc.allocate(ids, self.duet_budget * m * sum(alloc.length(q) for q in ids))
        self._strata = alloc.stratification()
        return [counts[q] for q in ids]

    def observe_advantages(self, advantages: Sequence[float], slots: int) -> None:
        """Alg. A.10 Phase 4 for DUET's allocator: each prompt's kept rollouts (their
        unweighted GRPO advantages, sampled sequence log-probs, lengths, statuses) into
        σ̂_q^obs and L̂_q.  ``advantages`` are TRL's, one per returned row."""
        if not self._strata:                    # no allocation this step
            return
        from vllm_rl.duet.weights import status_of

        for g, prompt in enumerate(self.last.prompts):
            rows = range(g * slots, (g + 1) * slots)
            rows = [i for i in rows if self.last_marks[i].info is not None]
            self.duet_allocation.observe(self.problem_id(prompt), [advantages[i] for i in rows],
                          [self._logprob_sums[i] for i in rows],
                          [self.last_marks[i].info.length for i in rows],
                          [status_of(self.last_marks[i].info) for i in rows])

    def _params(self, prompt: str, m: int, plan=None, n: int | None = None) -> SamplingParams:
        from vllm_rl import rl_params

        if n is None:
            n = plan.n if plan is not None else max(self.redundant or m, m)
        extra = None
        if self.flags is not None or self.partial is not None:
            flags = copy.deepcopy(self.flags or {})
            flags.setdefault("group", {})["size"] = min(m, n)
            if plan is not None and plan.off:               # M' = M: DARTS off here
                del flags["darts"]
            elif plan is not None:
                flags["group"]["redundant"] = plan.n
                darts = flags["darts"] = dict(flags["darts"] or {})
                if darts.get("mode", "auto") == "auto":     # an explicit mode stays
                    darts.update(mode=plan.mode, k=plan.k, m_up=plan.m_up)
            if "das" in flags:
                flags["das"].setdefault("problem_id", self.problem_id(prompt))
            extra = rl_params(**flags)
        seed = self.seed * 1_000_003 + self.calls * 10_007 + int(
            hashlib.blake2b(prompt.encode(), digest_size=4).hexdigest(), 16) % 10_007
        return SamplingParams(n=n, temperature=self.temperature, max_tokens=self.max_tokens,
                              logprobs=0, seed=seed, extra_args=extra)

    def load(self, trainer) -> None:
        """The trainer's weights into the engine, once per optimizer step."""
        step = trainer.state.global_step
        if self.sync_weights and step != self.loaded_step:
            from vllm_rl.weights import load_weights, sync_past

            model = trainer.accelerator.unwrap_model(trainer.model)
            report = load_weights(self.llm, {k: v.detach()
                                             for k, v in model.state_dict().items()})
            self.loaded_step = step
            self.weight_version = sync_past(self.llm, self.buffer.weight_version,
                                            (report or {}).get("weight_version"))

    def __call__(self, prompts: Sequence[Any], trainer) -> dict[str, list]:
        if self._prepared is None or self._prepared[0] != list(prompts):
            m = self._m_of(prompts)
            slots = self.prepare(prompts, trainer)
            if slots > m:
                raise ValueError(
                    f"this step has a group of {slots} samples that belong in the loss or "
                    f"the baseline (DARTS's M plus DUET's eps-kept), more than TRL's "
                    f"num_generations = {m}: train with vllm_rl.integrations.trl.trainer."
                    "RLGRPOTrainer, which gives each group the slots it needs (plain "
                    "GRPOTrainer would drop one)")
        result, self._prepared = self._prepared[1], None
        return result

    def prepare(self, prompts: Sequence[Any], trainer, multiple: int = 1,
                rows: Sequence[Any] | None = None) -> int:
        """Generate the step for ``prompts`` (each prompt M times in a row, as TRL hands
        them; ``rows``: TRL's input rows beside them) and return the slots per prompt its
        groups need (:meth:`slots`, raised so that the batch divides into ``multiple``
        equal parts); the next call with each prompt repeated that many times returns
        the rows (:class:`~vllm_rl.integrations.trl.trainer.RLGRPOTrainer` does both).
        With partial rollouts the step's groups are those complete (some started in
        earlier steps): :meth:`inputs` gives TRL's rows for them."""
        slots = self.slots(self._generate(prompts, trainer, rows))
        while (len(self.last.prompts) * slots) % max(multiple, 1):
            slots += 1
        self._prepared = ([p for p in self.last.prompts for _ in range(slots)],
                          self._rows(slots))
        return slots

    @staticmethod
    def _m_of(prompts: Sequence[Any]) -> int:
        """M: how many times TRL repeated the first prompt (each prompt M times in a row)."""
        m = 1
        while m < len(prompts) and prompts[m] == prompts[0]:
            m += 1
        return m

    def slots(self, m: int) -> int:
        """Rows per prompt the last step needs: M, or more where a group has more samples
        in the loss or its baseline (a DARTS group's M and DUET's eps-kept beside them)."""
        return max([m] + [sum(mk.keep or mk.baseline for mk in marks)
                          for marks in self.last.marks])

    def inputs(self, inputs: Sequence[dict], slots: int) -> list[dict]:
        """TRL's input rows for the prepared step: ``slots`` per group, in order."""
        if self.partial is None:
            m = self._m_of([x["prompt"] for x in inputs])
            return [dict(x) for x in inputs[::m] for _ in range(slots)]
        return [dict(row) for row in self.last.rows for _ in range(slots)]

    def _generate(self, prompts: Sequence[Any], trainer, rows: Sequence[Any] | None = None) -> int:
        """One step: the weights in, each distinct prompt once with n = M' (its plan),
        the records read and marked into :attr:`last`.  Returns M."""
        self.load(trainer)
        distinct, counts, first = [], [], []
        for i, p in enumerate(prompts):
            if distinct and p == distinct[-1]:
                counts[-1] += 1
            else:
                distinct.append(p)
                counts.append(1)
                first.append(i)
        plans = [None] * len(distinct)
        ids = [self.problem_id(p) for p in distinct]
        if self.flags is not None and "darts" in self.flags:
            planner = self._darts_planner(counts[0])
            if planner is not None:
                plans = planner.plan(ids)
        ns = self._allocate(ids, counts[0]) or [None] * len(distinct)
        params = [self._params(p, m, plan, n)
                  for p, m, plan, n in zip(distinct, counts, plans, ns)]
        rows = [None if rows is None else rows[i] for i in first]
        t0 = time.perf_counter()
        if self.partial is None:
            outs = self.llm.generate(list(distinct), params, use_tqdm=False)
            groups = [(p, row, sp, list(out.prompt_token_ids), [part_of(c, sp) for c in out.outputs])
                      for p, row, sp, out in zip(distinct, rows, params, outs)]
            carried = 0
            self._tokens = sum(len(part.token_ids) for g in groups for part in g[4])
        else:
            groups, carried = self._generate_partial(distinct, rows, params, trainer)
        wall = time.perf_counter() - t0
        self.calls += 1
        self.last = Rollout(prompts=[g[0] for g in groups], wall_s=wall,
                            redundant=[len(g[4]) for g in groups], carried=carried,
                            rows=[g[1] for g in groups])
        if self.partial is not None:
            self.last.staleness = staleness((p for g in groups for p in g[4]),
                                            self.weight_version)
        self._groups = [(g[3], g[4]) for g in groups]
        for prompt, _, sp, _, parts in groups:
            pid = self.problem_id(prompt)
            infos = [part.info for part in parts]
            flags = (sp.extra_args or {}).get("vllm_rl")
            marks = training_marks(infos, [flags] * len(parts))
            strata = self._strata.get(pid, 1.0)
            if strata != 1.0:           # Eq. 6: w = (1 - I_abort) / (s_pre p_abort)
                marks = [replace(mk, weight=mk.weight / strata) if mk.keep else mk
                         for mk in marks]
            self.last.flags.append(flags)
            self.last.infos.append([mk.info or i for mk, i in zip(marks, infos)])
            self.last.marks.append(marks)
            self.last.texts.append([part.text for part in parts])
        self.last.generated_tokens = self._tokens
        self._feedback()
        return counts[0]

    def _generate_partial(self, distinct, rows, params, trainer):
        """A step with partial rollouts (:mod:`vllm_rl.integrations.common.partial`): the
        carried groups' samples go on as continuations, the step's prompts start, the
        engine ends the step once its rule holds and carries what is unfinished.
        Returns the complete groups (the step's and earlier ones) and the samples
        carried."""
        keep = None if self.keep_prompt is None else (lambda g: self.keep_prompt(g.prompt))
        launched = self.buffer.launch(self.partial, trainer.state.global_step, distinct,
                                      params, self.max_tokens, self.temperature, rows, keep)
        outs = (self.llm.generate(launched.prompts, launched.params, use_tqdm=False)
                if launched.prompts else [])
        complete = self.buffer.finish(launched, outs)
        self.buffer.weight_version = self.weight_version
        self._tokens = launched.tokens
        carried = self.buffer.samples()
        groups = []
        for g in complete:
            sp = SamplingParams(n=len(g.ended), extra_args={"vllm_rl": g.flags})
            groups.append((g.prompt, g.row, sp, g.prompt_ids, g.ended))
        return groups, carried

    def _rows(self, slots: int) -> dict[str, list]:
        """``slots`` rows per prompt, in TRL's order: the training group, then the samples
        whose reward only counts in the baseline (DUET's aborted, Alg. A.10 l.38), then
        the others (in neither); a prompt with fewer samples than ``slots`` is padded with
        copies of its shortest sample marked out of everything (``env_mask`` 0, weight 0,
        baseline 0, record ``""``)."""
        result: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs",
                                                   "env_mask", WEIGHT, BASELINE, RECORD)}
        self.last_marks, self.last_texts, self._logprob_sums = [], [], []
        for (prompt_ids, comps), marks in zip(self._groups, self.last.marks):
            order = sorted(range(len(comps)), key=lambda i: _rank(marks[i]))[:slots]
            shortest = min(range(len(comps)), key=lambda i: len(comps[i].token_ids))
            order += [None] * (slots - len(order))
            for i in order:
                pad = i is None
                c = comps[shortest if pad else i]
                mark = PADDING if pad else marks[i]
                ids = list(c.token_ids)
                result["prompt_ids"].append(list(prompt_ids))
                result["completion_ids"].append(ids)
                result["logprobs"].append(list(c.logprobs))
                self._logprob_sums.append(sum(result["logprobs"][-1]))
                result["env_mask"].append([1 if mark.keep else 0] * len(ids))
                result[WEIGHT].append(mark.weight if mark.keep else 0.0)
                result[BASELINE].append(1 if mark.baseline else 0)
                result[RECORD].append("" if pad else (mark.info or c.info).encode())
                self.last_marks.append(mark)
                self.last_texts.append(c.text)
        self.last_weights = list(result[WEIGHT])
        self.last.trained = TrainedBatch.of([len(p) for p in result["prompt_ids"]],
                                            [len(c) for c in result["completion_ids"]])
        return result

    def _feedback(self) -> None:
        """Between steps: DARTS's length statistics, ARRoL's head and calibration, the
        regime log."""
        last = self.last
        if self.planner is not None:
            self.planner.observe({self.problem_id(p): [i.length for i in infos]
                                  for p, infos in zip(last.prompts, last.infos)})
        if self.arrol_feedback is None and self.regime_log is None:
            return
        infos, rewards, prompts = [], [], []
        for p, group, texts in zip(last.prompts, last.infos, last.texts):
            for info, text in zip(group, texts):
                infos.append(info)
                rewards.append(self.reward(p, text) if self.reward is not None else None)
                prompts.append(p)
        if self.regime_log is not None:
            self._log_regime(infos, rewards)
        if self.arrol_feedback is not None:
            update = self.arrol_feedback.observe(infos, rewards, prompts)
            if update is not None:
                self.llm.arrol_update(**update)
                self.last_arrol_update = update

    def _log_regime(self, infos: list[RolloutInfo], rewards: list) -> None:
        """The step's samples to the regime log (:mod:`vllm_rl.regime_log`)."""
        if self._regime_log is None:
            from vllm_rl.regime_log import RegimeLog

            self._regime_log = RegimeLog(
                self.regime_log, self.llm.get_tokenizer(), self.max_tokens,
                vocab_size=self.llm.llm_engine.model_config.get_vocab_size())
        log, samples, k = self._regime_log, [], 0
        for prompt, (_, parts) in zip(self.last.prompts, self._groups):
            group = f"{self.calls}:{self.problem_id(prompt)}"
            for part in parts:
                sample = log.sample(group, part.token_ids, infos[k], rewards[k])
                k += 1
                if sample is not None:
                    samples.append(sample)
        log.write(self.calls, samples)


# A padding row: its prompt had fewer samples than the batch's slots per prompt.
PADDING = TrainingMark(keep=False, weight=0.0, baseline=False, padding=True)


def _rank(mark: TrainingMark) -> tuple:
    """Training group first, then baseline-only samples, then the rest (engine order)."""
    return (not mark.keep, not mark.baseline)


def masked_reward(fn: Callable[..., list[float]]) -> Callable[..., list[float | None]]:
    """A TRL reward function that returns ``None`` for samples whose reward does not count
    in the group baseline (``vllm_rl_baseline`` 0: DARTS's unselected, ARRoL's pruned):
    TRL then leaves them out of its group mean and std and gives them zero advantage."""
    def reward(prompts, completions, **kwargs):
        values = fn(prompts, completions, **kwargs)
        baseline = kwargs.get(BASELINE)
        if baseline is None:                      # older callers: the weight decides
            baseline = [1 if w > 0 else 0 for w in (kwargs.get(WEIGHT) or [1.0] * len(values))]
        return [v if b else None for v, b in zip(values, baseline)]

    reward.__name__ = getattr(fn, "__name__", "reward")
    return reward
