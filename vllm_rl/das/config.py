"""Engine-level DAS settings (:class:`DASConfig`) and how they reach vLLM.

DAS runs as vLLM's ``custom_class`` speculative method: the engine is started with
``speculative_config={"method": "custom_class", "model": PROPOSER,
"num_speculative_tokens": 2b}`` (the long class drafts ``2b`` tokens, Sec. 4.2.3) and
the settings below in ``additional_config["vllm_rl_das"]``, which vLLM hands to every
worker with the rest of its config.  ``vllm_rl.LLM(das=...)`` / ``engine_args(das=...)``
build both; per-request flags (``das`` section of :mod:`vllm_rl.flags`) choose the
problem and the policy, and may lower ``b`` or set ``min_prob``.

vLLM runs CPU-side drafters (``ngram``, ``suffix``, ``custom_class``) with synchronous
scheduling only; ``patches/model_runner/das_async.py`` lets the DAS drafter run under async
scheduling (:class:`~vllm_rl.engine.scheduler.RLScheduler`), as stock vLLM schedules on
a GPU (``DASConfig.async_scheduling``, default on; off:
:class:`~vllm_rl.engine.scheduler.RLSyncScheduler`).
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from typing import Any

from vllm_rl.flags import DAS_POLICIES, MAX_DRAFT, FlagError, RLFlags

PROPOSER = "vllm_rl.das.drafter.DASProposer"
CONFIG_KEY = "vllm_rl_das"
BATCH_CAPS = ("phase", "cost", "linear", "confidence")     # DASConfig.batch_cap
CAP_MIN_PROB = 0.1      # the draft cutoff under the caps that set none (all but confidence)


@dataclass(frozen=True)
class DASConfig:
    """DAS settings of one engine.

    Trees (Sec. 4.1.2): ``window`` finished rollouts kept per problem (paper's default
    16), ``max_stored_tokens`` across all trees (oldest rollouts leave first),
    ``max_depth`` the longest indexed substring, ``prompt_tail`` prompt tokens stored in
    front of each rollout so the first output tokens have a context to match.

    Budgets (Sec. 4.2): ``budget`` is b (medium class b, long 2b), ``min_prob`` the
    draft cutoff of a request whose flags set none (None: :data:`CAP_MIN_PROB`, or none
    under the confidence cap, which sets its own).  ``policy`` is the budget policy of a
    request whose flags name none.  ``prior`` is the λ of the trees' probabilities
    (count / (count of the context + λ), :class:`vllm_rl.das.tree.SuffixTree`): 0 is
    SuffixDecoding's ratio, 1 PPM's method A, which keeps 1 / (n + 1) for a token the
    tree has not seen after a context seen n times.

    The batch cap (Sec. 4.2.1) scales budgets with the batch.  ``batch_cap="cost"``
    derives it from the engine's step-cost model (``vllm_rl.LLM(cost=...)``,
    :mod:`vllm_rl.cost`; fitted online when none is named): each step drafts the length
    that makes the step cheapest per generated token at its batch size and context
    (:func:`vllm_rl.das.batch_caps.cost_cap`), one length for every request from the
    engine's recent acceptance, so a memory-bound GPU drafts at full budget on small
    batches and not at all on a full one.  ``batch_cap="phase"`` makes the same choice
    per request (:func:`vllm_rl.das.batch_caps.phase_budgets`): each request's length from
    its own acceptance estimate (Eq. 3's k, shrunk toward its problem's and the
    engine's) and the tree's actual draft, minimising the step's expected time per
    generated token; drafting is off or short in the bulk of a rollout step and at full
    budget in its tail.  ``batch_cap="confidence"`` drafts every row's budget and cuts
    each draft where the tree's probability that it holds (with ``prior`` λ) falls
    below the price of one more draft token at the step's batch and context on the
    step-cost model (:meth:`vllm_rl.das.draft_lengths.DraftBudgets._draft_price`): long
    drafts on a small batch, only the likely ones on a wide one, decided on the cost
    model and the trees alone.  ``batch_cap="linear"`` is the fixed rule: full budget up to
    ``full_batch`` running requests, scaled down linearly above, off at ``off_batch``
    (``vllm-rl bench das-batch`` measures drafting's gain by batch size).  The defaults
    (``policy="fixed"``, ``batch_cap="confidence"``, ``prior=0.5``) were chosen on the
    projection of rollout steps on the H100 table against stock vLLM and the other
    policies, caps and priors, paired over seeds (``vllm-rl bench step --gpu-limits``;
    figures in ``docs/benchmarks.md``, "DAS's confidence cap"); DAS is lossless, so
    its settings are chosen by speed alone.
    ``c_base_ms``/``c_tok_ms`` are Eq. 1's per-pass and per-token costs used by the
    ``optimal`` policy (Eq. 6-7) when the cost model cannot answer (an online model
    before its first fit); otherwise Eq. 7 reads the cost model linearised at the step's
    batch and context (:meth:`vllm_rl.cost.StepCost.linear_at`); their defaults come from
    the PTL of the embedded model on a CPU (``benchmarks/ptl.py``).  ``round_horizon`` rounds in T_short's moving average,
    ``history`` final lengths kept for the class posterior.

    ``background_feed`` (default on): the rows that draft nothing this step have their
    new tokens fed into the trees on a worker thread, with the GIL released, while the
    engine schedules and computes the next step; the next :meth:`DASProposer.propose`
    (or any ``das_*`` call) waits for it first.  The rows that draft are fed before they
    draft, so a draft sees its own rollout up to its last token; it may miss the last
    step's token of a sibling rollout that drafted nothing.  The rollouts a window or
    the global token cap drops (a natural end pushes out its problem's oldest) leave
    their trees on the same thread, after the step's draft (or at the next ``das_*``
    call, which waits for them): a draft may still read a rollout dropped in that
    step.  Drafts stay lossless (vLLM verifies them) and, since every feed and
    removal is waited for before the next draft, reproducible.

    ``async_scheduling`` (default on): the engine schedules asynchronously, as stock
    vLLM does on a GPU (``patches/model_runner/das_async.py``).  vLLM schedules step n + 1 and
    processes step n - 1's output while step n runs; the drafter drafts at the start
    of step n + 1 from step n's tokens, the drafts it would make synchronously, and
    the worker cuts each request's speculative slots to its draft.  Off: the engine
    schedules synchronously (vLLM's only way for a ``custom_class`` drafter).  On
    vLLM's CPU platform every engine schedules synchronously unless its
    ``additional_config`` has ``vllm_rl_async_cpu: true``.  Async DAS needs one worker
    (tensor and pipeline parallel size 1).

    ``lookahead`` (default on; async scheduling only): the drafts of step n + 1 are made
    while step n runs, from the context up to step n - 1, step n's own drafts and
    hypotheses of its outcome (:mod:`vllm_rl.das.hypotheses`): of the outcomes (a, x),
    a of step n's drafts accepted and x one of the ``branches`` most frequent next
    tokens in the tree after them (the rejected draft token excluded; where the longest
    suffix has fewer, shorter suffixes add theirs, PPM's escape), the ``hypotheses``
    most likely by the tree's chance; with ``step_hypotheses`` > 0 a step shares that
    many among its drafting rows instead, at least ``hypotheses`` and at most 64 a row
    (so a full batch keeps 8 a row and a tail of 16 rows 64).  The device takes the
    hypothesis that step n's sampled tokens bear out, so nothing waits for them and
    vLLM prepares step n + 1's inputs under step n's forward pass as it does without
    drafts.  An outcome outside the hypotheses costs the verification of drafts that
    are rejected, never a token.  ``branches=16``, ``hypotheses=8`` and
    ``step_hypotheses=1024`` are the project's, chosen on nine paired seeds at 128 × 8
    and the host time at 1,024 live (``docs/benchmarks.md``, "Shorter suffixes fill
    the hypotheses").
    Off: a drafting step waits for step n's tokens and drafts from them (synchronous
    scheduling's drafts), and that wait and what follows it are host time on the
    step's path.

    ``threads`` (default 4): the lookahead's C++ call shares its rows among at most this
    many threads (at least 64 drafting rows a thread, and no more than the cores this
    process may run on), with the GIL released: the same hypotheses and drafts in less
    wall time on a wide batch.  The project's; measured here on this machine's two cores
    (``docs/benchmarks.md``, "The hypotheses on several threads").
    """

    budget: int = 4
    window: int = 16
    max_stored_tokens: int = 4_000_000
    max_depth: int = 32
    min_prob: float | None = None
    prior: float = 0.5
    prompt_tail: int = 16
    full_batch: int = 256
    off_batch: int = 1024
    policy: str = "fixed"
    batch_cap: str = "confidence"
    c_base_ms: float = 2.5
    c_tok_ms: float = 0.13
    round_horizon: int = 16
    history: int = 4096
    stats_rounds: int = 4096
    background_feed: bool = True
    async_scheduling: bool = True
    lookahead: bool = True
    branches: int = 16
    hypotheses: int = 8
    step_hypotheses: int = 1024
    threads: int = 4

    @property
    def draft_cutoff(self) -> float:
        """The cumulative-probability cutoff of a request whose flags set none:
        ``min_prob``, else :data:`CAP_MIN_PROB`, or none (0) under the confidence cap,
        which cuts each draft at its own price of a draft token."""
        if self.min_prob is not None:
            return self.min_prob
        return 0.0 if self.batch_cap == "confidence" else CAP_MIN_PROB

    def __post_init__(self) -> None:
        if not 1 <= self.branches <= 16:
            raise ValueError(f"DASConfig.branches={self.branches}: allowed int in [1, 16]")
        if not 1 <= self.hypotheses <= 64 or self.step_hypotheses < 0:
            raise ValueError(f"DASConfig.hypotheses={self.hypotheses}, step_hypotheses="
                             f"{self.step_hypotheses}: allowed ints in [1, 64] and >= 0")
        if not 1 <= self.threads <= 64:
            raise ValueError(f"DASConfig.threads={self.threads}: allowed int in [1, 64]")
        if not 1 <= self.budget <= MAX_DRAFT // 2:
            raise ValueError(f"DASConfig.budget={self.budget}: allowed int in [1, {MAX_DRAFT // 2}]")
        if self.window < 1 or self.max_stored_tokens < 1:
            raise ValueError("DASConfig.window and max_stored_tokens must be >= 1")
        if not 2 <= self.max_depth <= 1024:
            raise ValueError(f"DASConfig.max_depth={self.max_depth}: allowed int in [2, 1024]")
        if not 0 <= self.full_batch <= self.off_batch:
            raise ValueError("DASConfig: need 0 <= full_batch <= off_batch")
        if not 0.0 <= self.prior <= 1e6:
            raise ValueError(f"DASConfig.prior={self.prior}: allowed float in [0, 1e6]")
        if self.min_prob is not None and not 0.0 <= self.min_prob <= 1.0:
            raise ValueError(f"DASConfig.min_prob={self.min_prob}: allowed float in [0, 1]")
        if self.prompt_tail < 0 or min(self.round_horizon, self.history, self.stats_rounds) < 1:
            raise ValueError("DASConfig: prompt_tail >= 0; round_horizon, history, "
                             "stats_rounds >= 1")
        if self.policy not in DAS_POLICIES:
            raise ValueError(f"DASConfig.policy={self.policy!r}: allowed one of {DAS_POLICIES}")
        if self.batch_cap not in BATCH_CAPS:
            raise ValueError(f"DASConfig.batch_cap={self.batch_cap!r}: allowed one of "
                             f"{BATCH_CAPS}")
        if self.c_base_ms < 0 or self.c_tok_ms <= 0:
            raise ValueError("DASConfig: c_base_ms >= 0 and c_tok_ms > 0 (Eq. 1)")

    @property
    def num_speculative_tokens(self) -> int:
        return 2 * self.budget

    @classmethod
    def of(cls, value: "DASConfig | dict | bool") -> "DASConfig":
        from vllm_rl.checks import settings_of

        return settings_of(cls, value, "das")

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> "DASConfig | None":
        """The DAS settings of an engine, or None if it was not started with DAS."""
        spec = getattr(vllm_config, "speculative_config", None)
        if spec is None or spec.method != "custom_class" or spec.model != PROPOSER:
            return None
        extra = (getattr(vllm_config, "additional_config", None) or {}).get(CONFIG_KEY) or {}
        cfg = cls.of(dict(extra))
        if spec.num_speculative_tokens < cfg.num_speculative_tokens:
            cfg = cls.of({**asdict(cfg), "budget": max(1, spec.num_speculative_tokens // 2)})
        return cfg

    def engine_kwargs(self) -> dict[str, Any]:
        """The vLLM engine arguments that start a DAS engine (its scheduling:
        :meth:`vllm_rl.settings.EngineSettings.scheduling`)."""
        return {
            "speculative_config": {"method": "custom_class", "model": PROPOSER,
                                   "num_speculative_tokens": self.num_speculative_tokens},
            "additional_config": {CONFIG_KEY: asdict(self)},
        }


def default_problem_id(named_group: str | None, prompt_token_ids) -> str:
    """``das.problem_id`` when a request names none (the one place it is decided): the
    group id its caller named (``group.id`` as sent, not one the engine made up), else
    its prompt (same prompt, same tree)."""
    if named_group:
        return named_group
    h = hashlib.blake2b(digest_size=12)
    h.update(",".join(map(str, prompt_token_ids or ())).encode())
    return "prompt:" + h.hexdigest()


def check_engine(flags: RLFlags | None, vllm_config: Any) -> RLFlags | None:
    """Reject, at submission, DAS flags this engine cannot honour; the flags with the
    engine's policy filled in (the request's record names the policy it ran)."""
    das = None if flags is None else flags.das
    if das is None:
        return flags
    cfg = DASConfig.from_vllm_config(vllm_config)
    if cfg is None:
        raise FlagError("das", "this engine was started without the DAS drafter",
                        "an engine started with vllm_rl.LLM(das=True) or engine_args(das=...)")
    if das.budget is not None and das.budget > cfg.budget:
        raise FlagError("das.budget", f"value {das.budget} above the engine's b={cfg.budget}",
                        f"int in [0, {cfg.budget}]")
    if das.policy is None:
        flags = replace(flags, das=replace(das, policy=cfg.policy))
    return flags


__all__ = ["BATCH_CAPS", "DASConfig", "check_engine", "default_problem_id"]
