"""DARTS on the trainer side: how many samples each prompt gets and which ones it keeps.

Each step the trainer (DARTS paper, Sec. 4.2-4.3.1, App. B-D):

1. sets the total redundancy budget (App. B, Eq. 8-9: :mod:`.rollout_budget`), or a fixed share
   of it;
2. splits it over the batch by each prompt's smoothed length std (Eq. 5 / 10, Alg. 1):
   :func:`allocate`, from :class:`LengthStats`;
3. picks each prompt's sampling mode (Alg. 2, line 3): shortest-only with proactive
   early stop when the prompt's budget saturates at ``M_up = 2M``, else dual-end.

:class:`DartsPlanner` does the three every step (by default Eq. 8-9's adaptive total, λ
calibrated once, as the paper: the planner the integrations use; ``guard=True`` adds the
project's step-cost guard); :func:`plan` is one step of Eq. 9 with a given λ and cost
slope.  Each
:class:`PromptPlan`'s :meth:`~PromptPlan.rl_params` is the ``extra_args`` of the request
carrying the group.  Everything here is pure Python (stdlib only) and deterministic.
"""
from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_rl.checks import check_lengths
from vllm_rl.checks import check_int as _check_int
from vllm_rl.checks import check_real as _check_real
from vllm_rl.darts.regime_gate import TailWindow
from vllm_rl.flags import rl_params as _rl_params

__all__ = ["DartsPlanner", "LengthStats", "PromptPlan", "allocate", "allocation_objective",
           "ema", "marginal_gain", "minmax_norm", "plan", "sampling_mode"]

DUAL_END = "dual_end"
SHORTEST = "shortest"


# ------------------------------------------------------------------------ input checks


def _check_decay(name: str, value: Any) -> float:
    decay = _check_real(name, value, lo=0.0)
    if decay >= 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return decay


# ------------------------------------------------------------------- length statistics


def ema(previous: float | None, value: float, decay: float) -> float:
    """One exponential-moving-average step: ``decay * previous + (1 - decay) * value``.

    The first value seeds the average (``previous is None``), so it is not biased to 0.
    """
    return value if previous is None else decay * previous + (1.0 - decay) * value


class LengthStats:
    """Smoothed response-length statistics (Sec. 4.2.2, App. B, App. C).

    * Per prompt: the EMA of the (population) variance of the lengths of its samples,
      the smoothed historical variance σ̃²_L(q_i) of Sec. 4.2.2 / App. C; it changes
      only when that prompt is rolled out again.
    * Dataset level: EMAs of the mean L̃ and of the std σ̃_L of all the lengths of a
      step (pooled over its prompts), which give ρ = σ̃_L / L̃ (App. B, Eq. 7).

    :meth:`update` records one prompt's lengths; :meth:`end_step` folds the step's
    pooled lengths into the dataset-level EMAs.  Reading a dataset-level value
    (:meth:`rho`, :attr:`mean`, :attr:`dataset_std`, or :meth:`std` of an unseen
    prompt) folds any pending lengths in first, so calling :meth:`update` for every
    prompt of a step and then planning the next step is enough.

    The paper gives no EMA decay.  Defaults: ``prompt_decay=0.5`` (a prompt returns
    only once per epoch, after the policy has moved a lot, so its latest rollout counts
    half) and ``dataset_decay=0.9`` (updated every step: a horizon of about 10 steps).
    """

    def __init__(self, prompt_decay: float = 0.5, dataset_decay: float = 0.9) -> None:
        self.prompt_decay = _check_decay("prompt_decay", prompt_decay)
        self.dataset_decay = _check_decay("dataset_decay", dataset_decay)
        self._variance: dict[Hashable, float] = {}
        self._mean: float | None = None
        self._std: float | None = None
        self._pending: list[float] = []

    def __contains__(self, prompt_id: Hashable) -> bool:
        return prompt_id in self._variance

    def __len__(self) -> int:
        return len(self._variance)

    def update(self, prompt_id: Hashable, lengths: Iterable[float]) -> None:
        """Record the lengths (tokens) of the samples one prompt got this step.

        Pass all M'_i of them (σ²({l_i^1, ..., l_i^M'_i}) of Sec. 4.2.2).  For a group
        stopped early (Alg. 2, line 12) the cancelled samples' lengths so far are lower
        bounds, so the estimate for such a prompt is biased low.
        """
        values = check_lengths("lengths", lengths)
        if not values:
            raise ValueError("lengths must not be empty")
        variance = statistics.pvariance(values)
        self._variance[prompt_id] = ema(self._variance.get(prompt_id), variance,
                                        self.prompt_decay)
        self._pending.extend(values)

    def end_step(self) -> None:
        """Fold the step's pooled lengths into L̃ and σ̃_L (a no-op if none are pending)."""
        if not self._pending:
            return
        self._mean = ema(self._mean, statistics.fmean(self._pending), self.dataset_decay)
        self._std = ema(self._std, statistics.pstdev(self._pending), self.dataset_decay)
        self._pending = []

    def update_step(self, lengths_by_prompt: Mapping[Hashable, Iterable[float]]) -> None:
        """:meth:`update` every prompt of a step, then :meth:`end_step`."""
        for prompt_id, lengths in lengths_by_prompt.items():
            self.update(prompt_id, lengths)
        self.end_step()

    def variance(self, prompt_id: Hashable) -> float | None:
        """σ̃²_L(q_i), or ``None`` for a prompt never rolled out."""
        return self._variance.get(prompt_id)

    def std(self, prompt_id: Hashable) -> float:
        """σ̃_L(q_i) = sqrt(σ̃²_L(q_i)), the allocation signal of Eq. 5 / Alg. 1.

        Cold start: a prompt never rolled out gets the dataset-level σ̃_L (0.0 before
        the first step), i.e. it is treated as a typical draw from the dataset.
        """
        variance = self._variance.get(prompt_id)
        return self.dataset_std if variance is None else math.sqrt(variance)

    @property
    def mean(self) -> float:
        """L̃, the dataset-level EMA of the mean length (0.0 before the first step)."""
        self.end_step()
        return 0.0 if self._mean is None else self._mean

    @property
    def dataset_std(self) -> float:
        """σ̃_L, the dataset-level EMA of the length std (0.0 before the first step)."""
        self.end_step()
        return 0.0 if self._std is None else self._std

    def rho(self) -> float:
        """ρ = σ̃_L / L̃ (App. B, Eq. 7); 0.0 while there is no history (L̃ = 0)."""
        mean = self.mean
        return 0.0 if mean <= 0.0 else self.dataset_std / mean

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready snapshot (pending lengths are folded in first)."""
        self.end_step()
        return {
            "prompt_decay": self.prompt_decay,
            "dataset_decay": self.dataset_decay,
            "mean": self._mean,
            "std": self._std,
            "prompts": [[pid, var] for pid, var in self._variance.items()],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LengthStats:
        """Inverse of :meth:`to_dict`."""
        stats = cls(data["prompt_decay"], data["dataset_decay"])
        for name in ("mean", "std"):
            value = data[name]
            setattr(stats, f"_{name}", None if value is None else _check_real(name, value, 0.0))
        for pid, var in data["prompts"]:
            stats._variance[pid] = _check_real("variance", var, lo=0.0)
        return stats


# ------------------------------------------------------------- redundancy allocation


def minmax_norm(values: Sequence[float]) -> list[float]:
    """Norm(·) of Eq. 5: min-max normalization over the batch; all 1.0 if all equal."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    if hi == lo:
        return [1.0] * len(values)
    return [(v - lo) / (hi - lo) for v in values]


def marginal_gain(weight: float, m: int) -> float:
    """Alg. 1, line 4: Δ = w (1/M' − 1/(M'+1)), computed as w / (M' (M'+1))."""
    return weight / (m * (m + 1))


def allocation_objective(weights: Sequence[float], allocation: Sequence[int]) -> float:
    """The objective of Eq. 5 / 10: Σ_i w_i / M'_i."""
    return sum(w / m for w, m in zip(weights, allocation))


def allocate(stds: Sequence[float], M_total: int, M_low: int, M_up: int) -> list[int]:
    """Alg. 1: split ``M_total`` samples over the batch, minimizing Eq. 5 / 10.

    Weights are w_i = Norm(σ̃_L(q_i)) (:func:`minmax_norm`).  Every prompt starts at
    ``M_low``; each remaining unit goes to the prompt below ``M_up`` with the largest
    marginal gain Δ_i; ties go to the prompt with the fewest samples so far, then the
    lower index, so units with no gain (w_i = 0: the least variable prompts after
    min–max normalisation) are spread evenly rather than piled on the first prompt until
    it saturates at ``M_up`` (and runs shortest-only by its index).  A heap keyed by
    (−Δ_i, M'_i, i) makes it O(N log N + (M_total − N·M_low) log N).  The objective is
    separable and convex in each M'_i, so this greedy choice is optimal; the tie rule
    does not change the objective.
    """
    stds = [_check_real(f"stds[{i}]", s, lo=0.0) for i, s in enumerate(stds)]
    M_low = _check_int("M_low", M_low, 1)
    M_up = _check_int("M_up", M_up, M_low)
    M_total = _check_int("M_total", M_total, 0)
    n = len(stds)
    if not n * M_low <= M_total <= n * M_up:
        raise ValueError(f"M_total must be in [N*M_low, N*M_up] = [{n * M_low}, "
                         f"{n * M_up}] for N={n}, got {M_total}")
    weights = minmax_norm(stds)
    allocation = [M_low] * n
    heap = [(-marginal_gain(w, M_low), M_low, i) for i, w in enumerate(weights)] \
        if M_low < M_up else []
    heapq.heapify(heap)
    for _ in range(M_total - n * M_low):
        _, _, i = heapq.heappop(heap)
        allocation[i] += 1
        if allocation[i] < M_up:
            heapq.heappush(heap, (-marginal_gain(weights[i], allocation[i]), allocation[i], i))
    return allocation


# ------------------------------------------------------------------ per-prompt plans


def sampling_mode(redundant: int, m_up: int) -> str:
    """Alg. 2, line 3: dual-end while M'_i < M_up, else shortest-only + early stop."""
    return SHORTEST if redundant >= m_up else DUAL_END


@dataclass(frozen=True)
class PromptPlan:
    """One prompt's share of a step: ``n`` = M'_i samples, of which ``size`` = M kept.

    ``mode`` is ``"dual_end"`` (keep the ``k`` shortest and ``size - k`` longest valid
    samples, Alg. 2 lines 5-9) or ``"shortest"`` (keep the M shortest and stop the
    group once they have finished, Alg. 2 line 12).
    """

    prompt_id: Hashable
    n: int
    size: int
    mode: str
    k: int
    m_up: int

    @property
    def early_stop(self) -> bool:
        return self.mode == SHORTEST

    @property
    def off(self) -> bool:
        """M'_i = M: nothing to select or stop, DARTS is off for this prompt."""
        return self.n <= self.size

    def rl_params(self, group_id: str | None = None) -> dict[str, Any]:
        """The ``SamplingParams.extra_args`` of this group, sent as one request with
        ``n = self.n``.  ``group_id`` is required only when the group is sent as
        ``n`` single-sample requests instead (they must share it); for one request
        the engine names the group itself.
        """
        group: dict[str, Any] = {"size": self.size, "redundant": self.n}
        if group_id is not None:
            group["id"] = group_id
        darts = {"mode": self.mode, "k": self.k, "m_up": self.m_up}
        return _rl_params(group=group, darts=darts)


def plan(prompt_ids: Sequence[Hashable], stats: LengthStats, M: int, lam: float,
         k_cost: float, K: int | None = None) -> list[PromptPlan]:
    """Plan one step: Eq. 9 budget, Alg. 1 allocation, Alg. 2 switch.

    ``M_low = M`` and ``M_up = 2M`` (the paper's setting); the budget is
    :func:`adaptive_budget` of ``stats.rho()``, ``lam`` and ``k_cost`` (Eq. 6's slope,
    see :func:`cost_slope`), and each prompt's weight comes from ``stats.std``.
    ``K`` is the dual-end short size, default ``M - 1`` (the paper's L = 1).
    """
    ids = list(prompt_ids)
    if not ids:
        raise ValueError("prompt_ids must not be empty")
    M = _check_int("M", M, 1)
    K = M - 1 if K is None else _check_int("K", K, 0)
    if K > M:
        raise ValueError(f"K must be in [0, M] = [0, {M}], got {K}")
    m_up = 2 * M
    from vllm_rl.darts.rollout_budget import adaptive_budget

    total = adaptive_budget(stats.rho(), lam, k_cost, M, len(ids))
    allocation = allocate([stats.std(pid) for pid in ids], total, M, m_up)
    return [PromptPlan(pid, m, M, sampling_mode(m, m_up), K, m_up)
            for pid, m in zip(ids, allocation)]


# ------------------------------------------------------------------------ the planner


class DartsPlanner:
    """A step's per-prompt plan: redundancy M'_i (Alg. 1) and sampling mode (Alg. 2).

    Keeps each prompt's smoothed length variance (:class:`LengthStats`, Sec. 4.2.2) and,
    for a step's prompts,

    1. sets the total redundancy ``M_total``.  The default, ``budget="adaptive"``, is App.
       B's (Eq. 8-9): M_total = clip(⌊ρ_t / (λ k_t)⌋, MN, 2MN), with ρ_t = σ̃_L / L̃ the
       dataset-level EMAs of the lengths (:meth:`LengthStats.rho`, Eq. 7) and k_t the
       slope of Eq. 6's cost line, fitted on the step-cost model's PTL (``cost``: the
       shipped H100 table by default, any :func:`vllm_rl.cost.load_cost` spec) over the
       last step's lengths at this step's N (:func:`.rollout_budget.cost_slope`).  The paper
       gives no λ; unless ``lam`` is given it is calibrated once, on the first step with
       lengths, so that this step's M_total is App. B's observed mean 1.5 MN
       (:func:`.rollout_budget.lambda_for_budget`); after that the total follows ρ_t / k_t.
       1.5 MN (:attr:`COLD_BUDGET`) is the cold start, the first step only.  That is the
       paper's algorithm and the default.  The project's option ``guard=True`` adds one
       guard on top (off by default: the paper's shaping pays across steps, Sec. 4.2.2,
       which a one-step cost model cannot see): where the step-cost model predicts the
       plan's step slower than the same step with no redundancy
       (:func:`.rollout_budget.choose_budget` of the two: Eq. 4 at the batch still running, a
       dual-end group running all its samples, a saturated one stopping at its M-th
       valid end, the mean over :data:`.rollout_budget.DRAWS` seeded draws; prompts not seen
       yet take the last step's pooled lengths), the step runs at 1.0 MN: DARTS is off
       for it, as on a full batch.  With ``max_live`` (the engine's ``max_num_seqs``)
       a total whose samples would not all run at once is cut to the most that do.
       ``budget="cost"`` instead picks the cheapest multiple of MN among
       ``candidates`` on the same model (faster at small batches, but not the paper's
       total); a number in [1, 2] fixes the multiple (forced on: DARTS runs whatever it
       costs); :func:`adaptive_budget` is Eq. 8-9 alone,
    2. splits it with Alg. 1 over ``[M_low, M_up] = [M, 2M]`` by the normalised std
       (:func:`allocate`),
    3. gives each prompt Alg. 2's mode: dual-end (K = M − 1 shortest + L = 1 longest
       valid) while M'_i < M_up; **shortest-only with proactive early stop only where the
       allocation saturates**, M'_i = M_up (Sec. 4.3.1: "we ... treat the saturation of
       the budget (M'_i = M_up) as a proxy for severe long-tail characteristics").

    The project's option ``regime_gate=True`` (off by default: the paper's algorithm)
    runs a step at 1.0 MN, DARTS off for it, while the lengths DARTS let run to their
    end (:class:`.regime_gate.TailWindow`: the last 1,024 of prompts planned dual-end or
    off) are outside DARTS's regime: under 5% at the limit where it cuts the tail, else
    p99/p50 under 5 (:func:`.regime_gate.in_regime`, Sec. 1 and 4.3.1); it needs
    ``max_tokens``.  :attr:`metrics` has its figures (``darts/regime_*``).

    A prompt given M'_i = M has nothing to select or stop: its plan is ``off`` and
    :meth:`flags` sends no DARTS flags for it (its samples run as stock vLLM runs them).
    :attr:`metrics` says what the last plan did (the budget, whether the cost model
    chose it, the prompts off).

    Prompts never seen get the dataset-level std, so the first epoch is a uniform split
    (no saturation unless the budget is the full 2MN).  :meth:`observe` takes a step's
    lengths per prompt (every sample, early-ended ones with their partial length: Sec.
    4.2.2 uses the whole M'_i).
    """

    COLD_BUDGET = 1.5       # App. B's typical M_total / (M N): before lengths are known
    CANDIDATES = (1.0, 1.25, 1.5, 1.75, 2.0)
    MODES = ("adaptive", "cost")

    def __init__(self, M: int, budget: float | str = "adaptive", K: int | None = None,
                 stats: LengthStats | None = None, cost: Any = "h100",
                 max_tokens: int | None = None,
                 candidates: Sequence[float] = CANDIDATES, max_live: int | None = None,
                 seed: int = 0, lam: float | None = None, guard: bool = False,
                 regime_gate: bool = False) -> None:
        if budget in self.MODES:
            if cost is None:
                raise ValueError(f"DartsPlanner budget={budget!r} needs a step-cost model "
                                 "(cost=)")
            from vllm_rl.cost import load_cost

            self.cost = load_cost(cost)
        elif not (isinstance(budget, (int, float)) and 1.0 <= budget <= 2.0):
            raise ValueError(f"DartsPlanner budget={budget!r}: allowed a float in [1, 2] "
                             "(M_total / (M N), Eq. 9's range), 'adaptive' or 'cost'")
        if lam is not None:
            lam = _check_real("lam", lam, lo=0.0, strict=True)
        if not candidates or not all(1.0 <= c <= 2.0 for c in candidates):
            raise ValueError(f"DartsPlanner candidates={candidates!r}: floats in [1, 2]")
        self.M = int(M)
        self.budget = budget if budget in self.MODES else float(budget)
        self.lam, self.guard = lam, bool(guard)         # λ of Eq. 8 (None: calibrated)
        if regime_gate and max_tokens is None:
            raise ValueError("DartsPlanner regime_gate=True needs max_tokens (the share at "
                             "the limit is half its test)")
        self.regime = TailWindow() if regime_gate else None
        self._early_stop: set = set()                 # prompts the last plan stops early
        self.K = self.M - 1 if K is None else int(K)
        self.stats = stats or LengthStats()
        self.max_tokens, self.candidates = max_tokens, tuple(candidates)
        self.max_live, self.seed = max_live, int(seed)
        self._last: dict[Hashable, list[int]] = {}    # each prompt's last lengths
        self._recent: list[int] = []                  # the last step's pooled lengths
        self._steps = 0
        self.last_budget: float | None = None         # the multiple of MN the last plan used
        self.metrics: dict[str, float] = {}           # what the last plan did

    def _counts(self, ids: list, budget: float) -> list[int]:
        m_up = 2 * self.M
        total = min(len(ids) * m_up, max(len(ids) * self.M, round(budget * self.M * len(ids))))
        return allocate([self.stats.std(pid) for pid in ids], total, self.M, m_up)

    def plan(self, prompt_ids: Sequence[Hashable]) -> list[PromptPlan]:
        ids = list(prompt_ids)
        m_up = 2 * self.M
        budget, chosen = self.budget, 0.0
        if budget == "adaptive":
            budget, chosen = self._adaptive(ids)
        elif budget == "cost":
            budget = self.COLD_BUDGET
            if ids and all(pid in self._last for pid in ids):
                budget = self._cheapest(ids, self._fits(ids, self.candidates))[0]
                chosen = 1.0
        regime = self._regime_metrics()
        if regime.get("darts/regime_gate_open") == 0.0:
            budget = 1.0                   # outside DARTS's regime: off for this step
        self._steps += 1
        self.last_budget = budget
        counts = self._counts(ids, budget)
        plans = [PromptPlan(pid, m, self.M, sampling_mode(m, m_up), self.K, m_up)
                 for pid, m in zip(ids, counts)]
        self._early_stop = {p.prompt_id for p in plans if p.early_stop}
        off = sum(p.off for p in plans)
        self.metrics = {"darts/budget": float(budget), "darts/cost_chosen": chosen,
                        "darts/lambda": float(self.lam or 0.0),
                        "darts/prompts_off": float(off),
                        "darts/off": float(bool(plans) and off == len(plans)),
                        "darts/redundant": float(sum(counts)), **regime}
        return plans

    def _regime_metrics(self) -> dict[str, float]:
        """The regime gate's figures (empty without it; no decision before 64 lengths)."""
        if self.regime is None:
            return {}
        found = self.regime.test(self.max_tokens)
        if found is None:
            return {"darts/regime_gate_open": 1.0}
        open_, truncated, tail = found
        return {"darts/regime_gate_open": float(open_), "darts/regime_truncated": truncated,
                "darts/regime_tail": tail}

    def _fits(self, ids: list, budgets: Iterable[float]) -> list[float]:
        """The budgets whose samples all run at once (``max_live``); 1.0 always."""
        return [b for b in budgets if self.max_live is None or b == 1.0
                or round(b * self.M * len(ids)) <= self.max_live] or [1.0]

    def _cheapest(self, ids: list, budgets: Sequence[float]) -> tuple[float, float]:
        """The budget among ``budgets`` whose plan the step-cost model predicts cheapest
        (:func:`.rollout_budget.choose_budget`), with its predicted cost; a prompt with no
        lengths yet takes the last step's pooled ones."""
        from vllm_rl.darts.rollout_budget import DRAWS, choose_budget

        lengths = [self._last.get(pid) or self._recent for pid in ids]
        context = statistics.fmean(x for ls in lengths for x in ls) / 2
        budget, _, cost = choose_budget(
            budgets, lambda b: self._counts(ids, b), lengths, self.M, self.cost.ptl(context),
            self.max_tokens, m_up=2 * self.M, draws=DRAWS, seed=self.seed + self._steps)
        return budget, cost

    def _adaptive(self, ids: list) -> tuple[float, float]:
        """Eq. 8-9's total as a multiple of MN (see the class docstring), and whether the
        cost guard decided it (1.0) or not (0.0)."""
        from vllm_rl.darts.rollout_budget import adaptive_budget, cost_slope, lambda_for_budget

        rho = self.stats.rho()
        if not ids or not self._recent or rho <= 0.0:
            return self.COLD_BUDGET, 0.0
        n, mn = len(ids), self.M * len(ids)
        ptl = self.cost.ptl(statistics.fmean(self._recent) / 2)
        k = cost_slope(ptl, self._recent, self.M, n)
        if k <= 0.0:                       # extra samples cost nothing: Eq. 8's M̄* = ∞
            total = 2 * mn
        else:
            if self.lam is None:           # App. B's mean 1.5 MN at the first known step
                self.lam = lambda_for_budget(rho, k, self.COLD_BUDGET * mn)
            total = adaptive_budget(rho, self.lam, k, self.M, n)
        budget = total / mn
        if self.max_live is not None and total > self.max_live:
            budget = max(1.0, math.floor(self.max_live / n) / self.M)
        if not self.guard or budget == 1.0:
            return budget, 0.0
        best = self._cheapest(ids, [1.0, budget])[0]
        return best, float(best != budget)

    @staticmethod
    def flags(plan: PromptPlan) -> dict:
        """The ``darts`` and ``group`` sections for a plan (``rl_params`` keywords); none
        for a plan that is ``off``."""
        if plan.off:
            return {}
        return {"group": {"size": plan.size, "redundant": plan.n},
                "darts": {"mode": plan.mode, "k": plan.k, "m_up": plan.m_up}}

    def observe(self, lengths_by_prompt: Mapping[Hashable, Iterable[int]]) -> None:
        step = {k: list(v) for k, v in lengths_by_prompt.items() if v}
        self.stats.update_step(step)
        self._last.update(step)
        if step:
            self._recent = [x for v in step.values() for x in v]
        if self.regime is not None:          # uncensored lengths only: no early-stopped group
            self.regime.observe(x for k, v in step.items() if k not in self._early_stop
                                for x in v)
