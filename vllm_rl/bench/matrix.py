"""What each benchmark configuration sends: the techniques with the papers' defaults.

One place for the flags of ``stock``, each technique alone and the default combination
(``all``), shared by the step benchmark (:mod:`.step`) and the time-to-accuracy benchmark
(:mod:`vllm_rl.bench.train.command`):

* ``darts``: DARTS Alg. 2 with Alg. 1's per-prompt M' in [M, 2M] (a planner,
  :class:`vllm_rl.darts.DartsPlanner`: dual-end K = M − 1, L = 1; shortest-only with early
  stop where the allocation saturates);
* ``duet``: DUET's marker gate with the answer marker of the embedded task, ε = 0.05
  (Table 3), G scaled to ``max_tokens`` as App. A.3's 150 of 3,072; K1/K2 the engine's
  online estimate unless given.  The gate only: Thm. 1 / Eq. 4's allocation of samples
  across prompts (:mod:`vllm_rl.duet.allocation`) is not applied, every prompt gets the
  trainer's M;
* ``das``: DAS drafting from per-problem suffix trees with the engine's default policy,
  a constant 2b draft budget per round (``policy="fixed"``, chosen on the H100
  projection; not Sec. 4.2.3's length classes, ``policy="class"``, nor the paper's
  "Unlimited budget" baseline), under the engine's cost cap;
* ``arrol``: ARRoL at ``l_detect`` with ``return_hidden`` (the trainer fits the head);
* ``das+duet+arrol``: the three per-step techniques in one request (no redundant
  samples);
* ``all``: the four in one request, composed by the rule of ``docs/ARCHITECTURE.md``;
* ``partial`` (with any of them: ``all+partial``): APRIL's partial rollouts across steps,
  a trainer-side setting (:class:`vllm_rl.integrations.common.partial.PartialConfig`,
  its defaults; ``partial:tis`` corrects the loss with truncated importance sampling,
  ``partial:cap1`` caps the staleness at one step), no flag section of its own beyond
  the step's rule.

Each configuration runs on the engine a user would build for it (:func:`engine_kind`):
stock vLLM for ``stock``, the RL engine without the DAS drafter where no DAS flags are
sent, the DAS engine where they are.
"""
from __future__ import annotations

from typing import Any

from vllm_rl.duet.rule import scaled_grace as duet_grace
from vllm_rl.task.problems import ANSWER_PATTERN as TASK_MARKER

TECHNIQUES = ("darts", "duet", "das", "arrol")
PARTIAL = "partial"          # trainer side: APRIL's partial rollouts (bench train)
PER_STEP = "das+duet+arrol"
CONFIGS = ("stock", *TECHNIQUES, PER_STEP, "all")


def technique_flags(name: str, max_tokens: int, l_detect: int = 24,
                    duet: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The ``rl_params`` sections of configuration ``name`` (None: stock).  ``duet``
    overrides DUET's fields (e.g. K1/K2 from a previous step)."""
    techniques, options = parse(name)
    sections = {
        "darts": {"darts": {}},
        "duet": {"duet": {"pattern": TASK_MARKER, "grace": duet_grace(max_tokens),
                          "eps": 1.0 if "eps1" in options.get("duet", ()) else 0.05,
                          **({"regime_gate": True} if "regime" in options.get("duet", ())
                             else {}),
                          **(duet or {})}},
        "das": {"das": {"policy": "class"} if "class" in options.get("das", ()) else {}},
        "arrol": {"arrol": {"l_detect": l_detect, "return_hidden": True}},
    }
    if not techniques:
        return None
    return {k: v for s in techniques if s != PARTIAL for k, v in sections[s].items()}


def partial_setting(name: str) -> dict[str, Any] | None:
    """Configuration ``name``'s partial-rollout setting (``PartialConfig``'s fields), or
    None without ``partial``."""
    techniques, options = parse(name)
    if PARTIAL not in techniques:
        return None
    opts = options.get(PARTIAL, ())
    return {**({"loss": "tis"} if "tis" in opts else {}),
            **({"max_staleness": 1} if "cap1" in opts else {})}


# The project's options on a technique, named in a configuration as ``technique:option``
# (``darts:guard``): each departs from its paper's default (``docs/flags.md``).
# darts:guard: DartsPlanner(guard=True); darts:regime: DartsPlanner(regime_gate=True);
# das:class: Sec. 4.2.3's length classes; duet:eps1: eps = 1, the gate keeps every sample
# (DUET's trim alone: an ablation); duet:gate: the gate without the allocator (every
# prompt M; bench train's RolloutFunc); duet:regime: duet.regime_gate (the gate aborts
# only while at most 6% reach it with no marker).
OPTIONS = {"darts": ("guard", "regime"), "das": ("class",), "duet": ("eps1", "gate", "regime"),
           PARTIAL: ("tis", "cap1")}


def parse(name: str) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """A configuration's techniques and the project's options on them:
    ``"das+darts:guard"`` -> ``(("das", "darts"), {"darts": ("guard",)})``.  Any
    ``+``-combination of :data:`TECHNIQUES` is a configuration (``all``: the four)."""
    if name in ("stock", "all", PER_STEP):
        parts = {"stock": [], "all": list(TECHNIQUES)}.get(name, PER_STEP.split("+"))
    else:
        parts = name.split("+")
    techniques, options = [], {}
    for part in parts:
        tech, *opts = part.split(":")
        if tech == "all" and name != "all":
            techniques += [t for t in TECHNIQUES if t not in techniques]
            continue
        if tech not in TECHNIQUES + (PARTIAL,) or tech in techniques:
            raise ValueError(f"unknown configuration {name!r}: {part!r} is not one of "
                             f"{list(TECHNIQUES) + [PARTIAL]} (or named twice)")
        bad = [o for o in opts if o not in OPTIONS.get(tech, ())]
        if bad:
            raise ValueError(f"configuration {name!r}: {tech} has no option {bad[0]!r} "
                             f"(its options: {list(OPTIONS.get(tech, ())) or 'none'})")
        techniques.append(tech)
        if opts:
            options[tech] = tuple(opts)
    return tuple(techniques), options


def is_config(name: str) -> bool:
    """Whether ``name`` is a configuration (:func:`parse`)."""
    try:
        parse(name)
    except ValueError:
        return False
    return True


def engine_kind(name: str) -> str:
    """The engine a user would build for configuration ``name`` (ablations included):
    ``"stock"``, ``"das"`` (the RL engine with the DAS drafter) or ``"rl"`` (without)."""
    if name.startswith("stock"):
        return "stock"
    if name in ("das-off", "darts-shortest"):      # bench step's ablations
        return "das" if name == "das-off" else "rl"
    return "das" if "das" in parse(name)[0] else "rl"


__all__ = ["CONFIGS", "OPTIONS", "PARTIAL", "PER_STEP", "partial_setting", "is_config", "parse", "TASK_MARKER", "TECHNIQUES", "duet_grace", "engine_kind",
           "technique_flags"]
