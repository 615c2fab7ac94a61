"""Per-request RL flags: one typed schema under ``SamplingParams.extra_args["vllm_rl"]``.

Build them with :func:`rl_params`; they travel unchanged over the offline API
(``SamplingParams(extra_args=...)``) and the OpenAI-compatible server (``vllm_xargs``
or ``extra_body={"vllm_xargs": ...}``).  Every technique is off unless its section is
present; an absent field takes the paper's default.

One reader, :func:`read`, turns a request's ``extra_args`` into :class:`RLFlags` (every
form: nested, JSON string, dotted, and what vLLM's ``vllm_xargs`` conversion makes of
them).  The front end checks the flags once, at submission (the server's middleware,
``vllm_rl/http_flags.py``, and ``patches/input_processor.py``): a bad flag raises
:class:`FlagError` naming the flag and its allowed range, and only that request fails
(HTTP 400).  The front end writes the canonical form (:meth:`RLFlags.canonical`); the
engine reads it once per request (the scheduler's admission, :class:`FlagReads`: once
per distinct flags text; the worker-side readers once per request each,
:func:`read_or_warn`); the per-step loops never read dicts.
"""
from __future__ import annotations

import functools
import json
import logging
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable

KEY = "vllm_rl"          # the key in SamplingParams.extra_args
MAX_GROUP = 4096


class FlagError(ValueError):
    """A bad RL flag; ``flag`` is its dotted path, ``allowed`` says what it may be."""

    def __init__(self, flag: str, problem: str, allowed: str):
        self.flag, self.allowed = flag, allowed
        super().__init__(f"vllm_rl flag '{flag}': {problem}; allowed: {allowed}")


@dataclass(frozen=True)
class _Field:
    """One flag's declaration: its type, default (None: filled by the section's rule or
    the engine), range or choices, and where its paper sets it."""

    kind: type | tuple[type, ...]
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple[Any, ...] | None = None
    cite: str = ""

    def allowed(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind is bool:
            return "bool (or 0 / 1: vllm_xargs sends true / false as 1 / 0)"
        name = self.kind.__name__ if isinstance(self.kind, type) else "/".join(
            k.__name__ for k in self.kind)
        lo = "-inf" if self.lo is None else f"{self.lo:g}"
        hi = "inf" if self.hi is None else f"{self.hi:g}"
        return name if self.lo is None and self.hi is None else f"{name} in [{lo}, {hi}]"

    def check(self, path: str, value: Any) -> Any:
        if value is None:
            return None
        kinds = self.kind if isinstance(self.kind, tuple) else (self.kind,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            if float in kinds and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            elif bool in kinds and type(value) is int and value in (0, 1):
                value = bool(value)     # vllm_xargs carries no bool: vLLM sends true as 1
            else:
                raise FlagError(path, f"wrong type {type(value).__name__}", self.allowed())
        if isinstance(value, float) and value != value:
            raise FlagError(path, "value nan", self.allowed())
        if self.choices is not None and value not in self.choices:
            raise FlagError(path, f"value {value!r} not allowed", self.allowed())
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise FlagError(path, f"value {value!r} out of range", self.allowed())
        return value


def flag(kind: type | tuple[type, ...], default: Any = None, *, lo: float | None = None,
         hi: float | None = None, choices: tuple[Any, ...] | None = None, cite: str = ""):
    """A flag, declared once as a field of its section's dataclass: the reader's checks,
    the error's "allowed" text and :func:`schema` all come from here."""
    return field(default=default, metadata={"flag": _Field(kind, default, lo, hi, choices,
                                                           cite)})


def _fields(section: type) -> dict[str, _Field]:
    """A section dataclass's flags, in order."""
    return {f.name: f.metadata["flag"] for f in fields(section)}


def _section(name: str, raw: Any, flags: dict[str, _Field]) -> dict[str, Any]:
    """Type- and range-check one section; unknown keys are errors."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise FlagError(name, f"wrong type {type(raw).__name__}", "a mapping of flags")
    for key in raw:
        if key not in flags:
            raise FlagError(f"{name}.{key}", "unknown flag", "one of " + ", ".join(flags))
    return {k: f.check(f"{name}.{k}", raw.get(k, f.default)) for k, f in flags.items()}


# --------------------------------------------------------------------------- sections

@dataclass(frozen=True)
class GroupFlags:
    """Samples of one prompt: ``size`` = M kept for training, ``redundant`` = M' generated."""

    id: str = flag(str)
    size: int = flag(int, lo=1, hi=MAX_GROUP, cite="M (DARTS Alg. 2; GRPO's group)")
    redundant: int = flag(int, lo=1, hi=MAX_GROUP, cite="M' (DARTS Sec. 4.1)")


GROUP_FIELDS = _fields(GroupFlags)


@dataclass(frozen=True)
class DartsFlags:
    """DARTS trajectory sampling (Sec. 4.1, 4.3.1; Alg. 2).

    ``mode="shortest"`` keeps the M shortest valid samples and stops the group as soon
    as they have finished (Alg. 2 line 12); ``"dual_end"`` lets the group run and marks
    the ``k`` shortest and ``M - k`` longest (Alg. 2 lines 6-9); ``"auto"`` is Alg. 2's
    switch: shortest-only once ``M' >= m_up`` (default ``2M``), else dual-end.
    ``k`` defaults to ``M - 1`` (the paper's ``L = 1``).
    """

    mode: str = flag(str, "auto", choices=("auto", "dual_end", "shortest"), cite="Alg. 2")
    k: int = flag(int, lo=0, hi=MAX_GROUP, cite="K of Sec. 4.1.2 (L = M - K = 1)")
    m_up: int = flag(int, lo=1, hi=MAX_GROUP, cite="M_up of Alg. 2 (2M)")

    def early_stop(self, group: GroupFlags) -> bool:
        if self.mode == "auto":
            return group.redundant >= self.m_up
        return self.mode == "shortest"


DARTS_FIELDS = _fields(DartsFlags)


MARKER_KINDS = ("math", "code", "qa")
MAX_PATTERN = 256   # characters of a user marker pattern
RE2_MAX_MEM = 1 << 20   # bytes RE2 may use for one compiled user pattern


@functools.lru_cache(maxsize=256)
def compile_user_pattern(pattern: str) -> Callable[[str], bool]:
    """An RE2 detector for a user DUET pattern (``duet.pattern``); ValueError if it is
    too long, empty or not RE2.  Cached: the check at submission and every sample of a
    step share one compilation (:func:`vllm_rl.duet.markers.detector`)."""
    if len(pattern) > MAX_PATTERN:
        raise ValueError(f"pattern has {len(pattern)} characters")
    if not pattern:
        raise ValueError("pattern is empty")
    import re2

    options = re2.Options()
    options.max_mem = RE2_MAX_MEM
    options.log_errors = False
    try:
        compiled = re2.compile(pattern, options)
    except re2.error as e:
        raise ValueError(f"not an RE2 regular expression ({e})") from None
    return lambda text: compiled.search(text) is not None

@dataclass(frozen=True)
class DuetFlags:
    """DUET's marker-gated abort with eps-keep (Sec. 3.2, Eq. 5; Alg. A.10 l.15-31).

    From ``k1`` on, every ``poll`` tokens, the marker detector (``marker`` kind, or the
    user ``pattern``, an RE2 regex) reads the sample's output: the built-in markers the
    bytes of the tokens since the last poll, a pattern the last 256 tokens' bytes
    (:mod:`vllm_rl.duet.markers`).  A fired marker
    ends the sample at most ``grace`` (G) tokens later; a sample reaching ``k2 + grace``
    with no marker is aborted with probability ``1 - eps`` or kept to its end with weight
    ``1/eps``.  ``k1``/``k2`` left out: the engine's online estimate (App. A.3).
    Defaults: G = 150 and poll = 8 (App. A.3), eps = 0.05 (Table 3's default abort floor).
    ``regime_gate`` (off by default: the paper's gate always aborts) keeps every sample
    (eps = 1) while the engine's marker-less share at the gate is above the paper's 6%
    (:mod:`vllm_rl.duet.regime_gate`).
    """

    marker: str = flag(str, "math", choices=MARKER_KINDS, cite="Sec. 3.2 marker detector")
    pattern: str | None = flag(str)
    k1: int | None = flag(int, lo=0, hi=1 << 20, cite="K1, App. A.3 (p30 online)")
    k2: int | None = flag(int, lo=0, hi=1 << 20, cite="K2, App. A.3 (p80 online)")
    grace: int = flag(int, 150, lo=0, hi=1 << 20, cite="G = 150, App. A.3")
    eps: float = flag(float, 0.05, lo=1e-6, hi=1.0, cite="eps of Eq. 5-6, Table 3")
    poll: int = flag(int, 8, lo=1, hi=4096, cite="delta_poll = 8, App. A.3")
    regime_gate: bool = flag(bool, False, cite="the project's option: the gate aborts only "
                             "while at most 6% reach it with no marker (App. A.4)")


DUET_FIELDS = _fields(DuetFlags)


DAS_POLICIES = ("class", "optimal", "fixed")
MAX_DRAFT = 64   # tokens per verification round

@dataclass(frozen=True)
class DasFlags:
    """DAS speculative decoding from the problem's suffix tree (Sec. 4.1-4.2).

    ``problem_id`` names the tree the request drafts from and feeds; left out, the front
    end sets it to the group id when the flags name one (``group.id``), else to the
    prompt itself (:func:`vllm_rl.das.config.default_problem_id`).  Trees carry across
    steps only under a stable id: verl's ``uid`` is fresh every step, so send the
    dataset index (or leave the group unnamed and let the prompt key the tree).
    ``policy`` sets the draft budget per verification round: ``"class"`` the length
    classes of Sec. 4.2.3 (0 / b / 2b), ``"optimal"`` Eq. 7 from online acceptance
    estimates, ``"fixed"`` always 2b (a constant budget of this project's, not a policy
    of the paper: its budget-agnostic baseline of Sec. 5.3, "DAS Unlimited budget",
    drafts as far as the tree allows); left
    out, the engine's ``DASConfig.policy`` (``"fixed"``, chosen on the H100 projection,
    ``docs/benchmarks.md``), written into the request's flags at submission.  ``budget``
    is b (default: the engine's), ``min_prob`` the draft's cumulative-probability cutoff
    (default: the engine's, 0.1).  DAS switches itself off where drafting would cost more
    than it saves (the engine's batch cap: a full batch on a GPU; each record's
    ``draft_off_steps`` says how long); ``force: true`` drafts this request's budget
    whatever the cap says (forced on; ``budget: 0`` forces it off).
    The engine must have been started with DAS (``vllm_rl.LLM(das=True)``).
    """

    problem_id: str | None = flag(str, cite="the problem's suffix tree, Sec. 4.1")
    policy: str | None = flag(str, choices=DAS_POLICIES, cite="Sec. 4.2.3 classes, Eq. 7")
    budget: int | None = flag(int, lo=0, hi=MAX_DRAFT, cite="b of Sec. 4.2")
    min_prob: float | None = flag(float, lo=0.0, hi=1.0)
    force: bool = flag(bool, False)


DAS_FIELDS = _fields(DasFlags)


@dataclass(frozen=True)
class RLFlags:
    """The parsed flags of one request; a ``None`` section means the technique is off."""

    group: GroupFlags | None = None
    darts: DartsFlags | None = None
    duet: DuetFlags | None = None
    das: DasFlags | None = None
    arrol: ArrolFlags | None = None
    partial: PartialFlags | None = None

    def canonical(self) -> dict[str, Any]:
        """The canonical form: every section on, every field filled (what the front end
        writes into the request's params; :func:`read` of it gives these flags back)."""
        out = {name: asdict(section) for name in SECTIONS
               if (section := getattr(self, name)) is not None}
        partial = out.get("partial")
        if partial is not None:       # spans as lists again: JSON's form, read's input
            for key in ("prior_versions", "group_ended"):
                if partial[key] is not None:
                    partial[key] = [list(pair) for pair in partial[key]]
        return out


@dataclass(frozen=True)
class ArrolFlags:
    """ARRoL's quality-head pruning (Sec. 4.2; App. A.4 Eq. 1-2; Alg. 1 l.17-21).

    When the sample has generated ``l_detect`` tokens, the engine's quality head scores
    the final-norm hidden state of its ``l_detect``-th token; with the trainer's
    calibration the score becomes a posterior q and the survival probability
    p = clip(κ + δ + λ(ρ − q), p_min, p_max) (Eq. 2, ``kappa``, ``rho``, ``lam``,
    ``p_min``, ``p_max``); the sample is pruned with probability 1 − p (a coin from its
    seed).  ``return_hidden`` keeps that hidden state on the worker for the trainer to
    fit the head (the record names it: ``hidden_id``).  Defaults: the paper's
    L_detect = 512, κ = ρ = λ = 0.5; the paper clips p to [p_min, p_max] without giving
    values, so [0.1, 0.9] is this project's choice.  The engine must have a head loaded (``vllm_rl.LLM(arrol=...)``).
    """

    l_detect: int = flag(int, 512, lo=1, hi=1 << 20, cite="L_detect = 512, Alg. 1 l.15")
    kappa: float = flag(float, 0.5, lo=0.0, hi=1.0, cite="kappa of Eq. 2")
    rho: float = flag(float, 0.5, lo=0.0, hi=1.0, cite="rho of Eq. 2")
    lam: float = flag(float, 0.5, lo=0.0, hi=16.0, cite="lambda of Eq. 2")
    p_min: float = flag(float, 0.1, lo=0.0, hi=1.0, cite="Eq. 2's clip (the project's value)")
    p_max: float = flag(float, 0.9, lo=0.0, hi=1.0, cite="Eq. 2's clip (the project's value)")
    return_hidden: bool = flag(bool, False)


ARROL_FIELDS = _fields(ArrolFlags)


@dataclass(frozen=True)
class PartialFlags:
    """Partial rollouts across steps (APRIL, Zhou et al. 2025: over-provision, end the
    step once enough is complete, carry the rest into the next step).

    The step's rule, on every request of a step (``step``, the trainer's step): the
    engine ends the step once ``until_groups`` of its groups are complete (every member
    ended; a sample without a group is a group of one), once its samples have generated
    ``until_tokens`` tokens, or ``until_s`` seconds after its first request arrived,
    whichever comes first (the last two once a group is complete).  Its samples still generating then end with reason
    ``carried``, their tokens, logprobs and record returned; a sample already
    ``max_staleness`` steps past its ``start_step`` ends ``stale`` instead (dropped).

    A continuation (``prior_tokens`` > 0) is a carried sample sent again: its prompt is
    the original prompt followed by its ``prior_tokens`` tokens so far (recomputed on
    the engine's current weights), ``seed`` the original request's seed (its coins are
    the uncarried sample's), ``prior_versions`` the weight-version spans of those tokens
    (``[[v, i], ...]``), ``group_ended`` its group's members that will not arrive
    (``[[length, valid], ...]``: ended in earlier steps, or dropped).  Every technique
    counts the whole sample (``docs/ARCHITECTURE.md``, "Partial rollouts").
    """

    step: int | None = flag(int, lo=0, cite="the trainer step the request belongs to")
    until_groups: int | None = flag(int, lo=1, hi=1 << 20,
                                    cite="N of APRIL: complete groups that end the step")
    until_tokens: int | None = flag(int, lo=1, cite="a share of the step's token budget")
    until_s: float | None = flag(float, lo=0.0, cite="a time limit for the step")
    max_staleness: int | None = flag(int, lo=0, hi=1 << 20,
                                     cite="steps a sample may be carried (none: APRIL)")
    start_step: int | None = flag(int, lo=0, cite="the step the sample started in")
    prior_tokens: int = flag(int, 0, lo=0, hi=1 << 24, cite="tokens generated before")
    seed: int | None = flag(int, cite="the original request's seed")
    prior_versions: list | None = flag(list, cite="weight-version spans of the prior tokens")
    group_ended: list | None = flag(list, cite="the group's members that will not arrive")

    def continuation(self) -> bool:
        return self.prior_tokens > 0


PARTIAL_FIELDS = _fields(PartialFlags)


def read_step(value: Any) -> int:
    """A trainer step as ``partial.step`` reads it (an int >= 0; no bool, float, string
    or None): what ``end_step`` takes, on every path (a drop-in's call, the engine-core
    utility, ``POST /vllm_rl/end_step``).  :class:`FlagError` otherwise, naming
    ``partial.step``."""
    if value is None:
        raise FlagError("partial.step", "missing", PARTIAL_FIELDS["step"].allowed())
    return PARTIAL_FIELDS["step"].check("partial.step", value)


SECTIONS = ("group", "darts", "duet", "das", "arrol", "partial")


def schema() -> list[tuple[str, str, Any, str]]:
    """Every flag as declared: (``section.flag``, what it may be, its default, where its
    paper sets it); ``docs/flags.md``'s tables follow it (``tests/unit/test_flags.py``)."""
    sections = {"group": GroupFlags, "darts": DartsFlags, "duet": DuetFlags, "das": DasFlags,
                "arrol": ArrolFlags, "partial": PartialFlags}
    return [(f"{name}.{k}", f.allowed(), f.default, f.cite)
            for name in SECTIONS for k, f in _fields(sections[name]).items()]


def _group(raw: dict[str, Any], n: int | None, path: str = "group") -> dict[str, Any]:
    g = _section(path, raw, GROUP_FIELDS)
    if n is not None and n > 1:
        if g["redundant"] is None:
            g["redundant"] = n
        elif g["redundant"] != n:
            raise FlagError(f"{path}.redundant", f"{g['redundant']} differs from n={n}",
                            f"equal to n ({n}) when one request carries the whole group")
    if g["size"] is None:
        g["size"] = g["redundant"] or n or 1
    if g["redundant"] is None:
        g["redundant"] = g["size"]
    if g["redundant"] < g["size"]:
        raise FlagError(f"{path}.redundant", f"{g['redundant']} < group.size {g['size']}",
                        f"int in [{g['size']}, {MAX_GROUP}] (M' >= M)")
    return g


def _darts(raw: dict[str, Any], g: dict[str, Any]) -> dict[str, Any]:
    d = _section("darts", raw, DARTS_FIELDS)
    m = g["size"]
    if d["k"] is None:
        d["k"] = max(m - 1, 0)
    if d["k"] > m:
        raise FlagError("darts.k", f"{d['k']} > group.size {m}", f"int in [0, {m}] (K <= M)")
    if d["m_up"] is None:
        d["m_up"] = 2 * m
    if d["m_up"] < m:
        raise FlagError("darts.m_up", f"{d['m_up']} < group.size {m}", f"int in [{m}, {MAX_GROUP}]")
    return d


def _duet(raw: dict[str, Any]) -> dict[str, Any]:
    d = _section("duet", raw, DUET_FIELDS)
    if d["k1"] is not None and d["k2"] is not None and d["k1"] > d["k2"]:
        raise FlagError("duet.k1", f"{d['k1']} > duet.k2 {d['k2']}", f"int in [0, {d['k2']}] (K1 <= K2)")
    if d["pattern"] is not None:
        try:
            compile_user_pattern(d["pattern"])
        except ValueError as e:
            raise FlagError("duet.pattern", str(e),
                            f"an RE2 regular expression of at most {MAX_PATTERN} characters") from None
    return d


def _arrol(raw: dict[str, Any]) -> dict[str, Any]:
    a = _section("arrol", raw, ARROL_FIELDS)
    if a["p_min"] > a["p_max"]:
        raise FlagError("arrol.p_min", f"{a['p_min']} > arrol.p_max {a['p_max']}",
                        f"float in [0, {a['p_max']}] (p_min <= p_max)")
    return a


def _pairs(path: str, value: Any, kinds: tuple[type, type]) -> tuple | None:
    """A list of pairs (``[[a, b], ...]``), checked, as a tuple of tuples."""
    if value is None:
        return None
    allowed = f"a list of [{kinds[0].__name__}, {kinds[1].__name__}] pairs"
    out = []
    for pair in value:
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(x, k) and not (k is int and isinstance(x, bool))
                           for x, k in zip(pair, kinds))):
            raise FlagError(path, f"entry {pair!r}", allowed)
        if pair[0] < 0 or (kinds[1] is int and pair[1] < 0):
            raise FlagError(path, f"negative entry {pair!r}", allowed)
        out.append(tuple(pair))
    return tuple(out)


def _partial(raw: dict[str, Any]) -> dict[str, Any]:
    p = _section("partial", raw, PARTIAL_FIELDS)
    versions = _pairs("partial.prior_versions", p["prior_versions"], (int, int))
    if versions is not None and (not versions or versions[0][1] != 0 or any(
            b[1] <= a[1] or b[1] >= p["prior_tokens"] for a, b in zip(versions, versions[1:]))):
        raise FlagError("partial.prior_versions", f"spans {p['prior_versions']!r}",
                        "spans [[v0, 0], [v1, i1], ...] with 0 < i1 < ... < prior_tokens")
    _pairs("partial.group_ended", p["group_ended"], (int, bool))
    if p["prior_tokens"] and p["start_step"] is None:
        raise FlagError("partial.start_step", "missing", "the step a continuation started in")
    return p


def extract(extra_args: dict[str, Any] | None) -> dict[str, Any] | None:
    """The raw RL flags of a request's ``extra_args``, or None if it has none (a step
    of :func:`read`, the reader every component calls).

    The OpenAI server's ``vllm_xargs`` holds only flat values, so besides the nested
    mapping the flags may come as a JSON string (``{"vllm_rl": "{\"darts\": {}}"}``, what
    :func:`rl_xargs` builds) or as dotted keys (``{"vllm_rl.darts.mode": "shortest"}``).
    """
    if not extra_args:
        return None
    if not isinstance(extra_args, dict):
        raise FlagError(KEY, f"extra_args of type {type(extra_args).__name__}",
                        "extra_args a mapping")
    raw = extra_args.get(KEY)
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise FlagError(KEY, f"invalid JSON ({e.msg})", "a JSON object of technique sections")
    dotted = [k for k in extra_args if isinstance(k, str) and k.startswith(KEY + ".")]
    if not dotted:
        return raw
    if raw is not None and not isinstance(raw, dict):
        raise FlagError(KEY, f"wrong type {type(raw).__name__}", "a mapping of technique sections")
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in (raw or {}).items()}
    for key in dotted:
        parts = key.split(".")
        if len(parts) != 3:
            raise FlagError(key[len(KEY) + 1:], "malformed dotted flag",
                            f"'{KEY}.<section>.<flag>'")
        section = raw.setdefault(parts[1], {})
        if not isinstance(section, dict):
            raise FlagError(parts[1], "given both as a value and as dotted flags", "one form")
        section[parts[2]] = extra_args[key]
    return raw


def normalize(raw: Any, n: int | None = None, default_group_id: str | None = None) -> dict:
    """Check raw flags and return their canonical form (defaults filled in; a step of
    :func:`read`).

    ``n`` is the request's ``SamplingParams.n`` (a group sent as one request);
    ``default_group_id`` names the group when the flags do not.
    """
    if not isinstance(raw, dict):
        raise FlagError(KEY, f"wrong type {type(raw).__name__}", "a mapping of technique sections")
    for key in raw:
        if key not in SECTIONS:
            raise FlagError(key, "unknown technique section", "one of " + ", ".join(SECTIONS))
    out: dict[str, Any] = {}
    if raw.get("group") is not None or raw.get("darts") is not None or (n or 1) > 1:
        g = _group(raw.get("group") or {}, n)
        if g["id"] is None:
            if n is not None and g["redundant"] > n:
                raise FlagError("group.id", "missing", "a string shared by the "
                                f"{g['redundant']} requests of a group sent one sample each")
            g["id"] = default_group_id or uuid.uuid4().hex
        out["group"] = g
    if raw.get("darts") is not None:
        out["darts"] = _darts(raw["darts"], out["group"])
    if raw.get("duet") is not None:
        out["duet"] = _duet(raw["duet"])
    if raw.get("das") is not None:
        out["das"] = _section("das", raw["das"], DAS_FIELDS)
    if raw.get("arrol") is not None:
        out["arrol"] = _arrol(raw["arrol"])
    if raw.get("partial") is not None:
        out["partial"] = _partial(raw["partial"])
        if out["partial"]["prior_tokens"]:
            # A continuation is never scored by ARRoL: a sample is scored once, at its
            # l_detect-th token, in the part that reached it (its record keeps it).
            out.pop("arrol", None)
    return out


def parse(canonical: dict[str, Any]) -> RLFlags:
    """Typed flags from their canonical form (as produced by :func:`normalize`; a step
    of :func:`read`)."""
    g, d, u = canonical.get("group"), canonical.get("darts"), canonical.get("duet")
    s, a = canonical.get("das"), canonical.get("arrol")
    p = canonical.get("partial")
    if p is not None:
        p = dict(p, prior_versions=_pairs("partial.prior_versions", p.get("prior_versions"),
                                          (int, int)),
                 group_ended=_pairs("partial.group_ended", p.get("group_ended"), (int, bool)))
    return RLFlags(
        group=GroupFlags(**g) if g else None,
        darts=DartsFlags(**d) if d else None,
        duet=DuetFlags(**u) if u else None,
        das=DasFlags(**s) if s is not None else None,
        arrol=ArrolFlags(**a) if a is not None else None,
        partial=PartialFlags(**p) if p is not None else None,
    )


def read(extra_args: dict[str, Any] | None, n: int | None = None,
         default_group_id: str | None = None) -> RLFlags | None:
    """The one flags reader: a request's typed flags from its ``extra_args`` (what vLLM
    delivers: ``SamplingParams.extra_args``, or the server's ``vllm_xargs`` after vLLM's
    conversion), or None if it carries none.  Raises :class:`FlagError` naming the flag
    and its allowed range.

    Every form reads the same: nested (``{"vllm_rl": {...}}``), a JSON string
    (``{"vllm_rl": "{...}"}``, :func:`rl_xargs`), dotted keys
    (``{"vllm_rl.arrol.l_detect": 24}``, mixed with either), and the canonical form
    (:meth:`RLFlags.canonical`, which the front end writes; reading it again is a fixed
    point).  A bool flag also takes the ints 0 and 1: ``vllm_xargs`` holds no bool and
    vLLM turns a JSON ``true`` there into ``1``.  ``n`` is ``SamplingParams.n`` (a group
    sent as one request; None: not checked against it); ``default_group_id`` names a
    group the flags leave unnamed (None: a fresh uuid).
    """
    raw = extract(extra_args)
    if raw is None:
        return None
    try:
        return parse(normalize(raw, n=n, default_group_id=default_group_id))
    except FlagError:
        raise
    except (TypeError, ValueError, AttributeError) as e:     # a value no field check names
        raise FlagError(KEY, f"malformed flags ({e})", "the schema of docs/flags.md") from None


_WARNED: OrderedDict[str, None] = OrderedDict()   # request ids warned about, this process
_WARNED_MAX = 4096


def read_or_warn(extra_args: dict[str, Any] | None, request_id: str,
                 log: logging.Logger | None = None, **kwargs: Any) -> RLFlags | None:
    """:func:`read` for the readers past the front end (the scheduler, the DAS drafter,
    the ARRoL scorer, the router).  The front end has rejected every bad flag with a 400,
    so what reaches them is canonical; anything else (the front end bypassed) is logged
    once per request id in this process, never per step, and the request is served
    without RL flags (None)."""
    try:
        return read(extra_args, **kwargs)
    except FlagError as e:
        if request_id not in _WARNED:
            _WARNED[request_id] = None
            while len(_WARNED) > _WARNED_MAX:
                _WARNED.popitem(last=False)
            (log or logging.getLogger(__name__)).warning(
                "request %s: %s; served without its vllm_rl flags", request_id, e)
        return None


class FlagReads:
    """:func:`read_or_warn` for the scheduler's admissions, each distinct flags text read
    once.  The samples of a group arrive with equal flags (vLLM's parallel sampling gives
    each child a shallow copy of the parent's params; past the engine's process boundary
    each child carries an equal copy): the first is read, the others get its
    :class:`RLFlags` (frozen, so shared).  The key is the ``repr`` of the flags as sent
    (the front end vetted them: builtin values only); flags in dotted keys, and flags
    whose group was named by the request id (``default_group_id``), are read every
    time.  The last ``size`` texts are kept."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._read: OrderedDict[str, RLFlags] = OrderedDict()

    def read(self, extra_args: dict[str, Any], request_id: str,
             log: logging.Logger | None = None,
             default_group_id: str | None = None) -> RLFlags | None:
        raw = extra_args.get(KEY)
        key = None if raw is None or any(isinstance(k, str) and k.startswith(KEY + ".")
                                         for k in extra_args) else repr(raw)
        if key is not None:
            flags = self._read.get(key)
            if flags is not None:
                self._read.move_to_end(key)
                return flags
        flags = read_or_warn(extra_args, request_id, log, default_group_id=default_group_id)
        if (key is not None and flags is not None
                and (flags.group is None or flags.group.id != default_group_id)):
            self._read[key] = flags
            if len(self._read) > self.size:
                self._read.popitem(last=False)
        return flags


def rl_params(group: dict | None = None, darts: dict | bool | None = None,
              duet: dict | bool | None = None, das: dict | bool | None = None,
              arrol: dict | bool | None = None, **sections: Any) -> dict[str, Any]:
    """The ``extra_args`` dict that switches techniques on for a request.

    >>> SamplingParams(n=16, extra_args=rl_params(group={"size": 8}, darts={"mode": "shortest"}))

    ``darts=True`` enables DARTS with its defaults.  Flags are checked here too, so a
    mistake shows at the call site.
    """
    raw: dict[str, Any] = {}
    if group is not None:
        raw["group"] = dict(group)
    for name, value in {"darts": darts, "duet": duet, "das": das, "arrol": arrol,
                        **sections}.items():
        if value is not None and value is not False:
            raw[name] = {} if value is True else dict(value)
    normalize(raw)  # fail early; the raw form is sent, the engine fills the defaults
    return {KEY: raw}


def rl_xargs(**sections: Any) -> dict[str, str]:
    """The same flags as :func:`rl_params`, in the form the OpenAI server's ``vllm_xargs`` takes."""
    return {KEY: json.dumps(rl_params(**sections)[KEY], separators=(",", ":"))}
