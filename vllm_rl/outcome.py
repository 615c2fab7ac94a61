"""What happened to each sample: :class:`RolloutInfo` and the :class:`Reason` enum.

A flagged sample's record is its own field, beside vLLM's: ``CompletionOutput.rollout_info``
in the offline API and ``choices[i].rollout_info`` (a JSON object, streamed on the final
chunk of each choice) on the OpenAI server (``docs/serving.md``).  vLLM's
``stop_reason`` keeps vLLM's meaning everywhere a client reads it: the stop string or
token that ended the sample, else None.  A request without RL flags gets no record.

Inside the engine the record crosses the engine core's process boundary in the one
field vLLM already carries from the scheduler to the front end, the finished request's
``stop_reason`` (:meth:`RolloutInfo.encode`, ``"vllm_rl:{json}"``, vLLM's own value kept
in ``stop``); the front end takes it out before it builds the client's output
(``patches/output_processor.py``), so no client sees the carrier.

Group-level marks that only exist once the whole group is back (DARTS dual-end
selection) are added on the client side by :func:`vllm_rl.darts.rule.annotate_group`,
which ``vllm_rl.LLM`` calls for you.

The record stays compact: a hidden state (ARRoL's ``return_hidden``) never travels in
it.  The worker keeps the vector (:mod:`vllm_rl.arrol.hidden`) and the record names it
(``hidden_id``, the engine request id); the client takes the vectors with the
``arrol_hidden`` RPC (:func:`hidden_ids`, :func:`with_hidden`; ``vllm_rl.LLM.generate``
does it for you) and :meth:`RolloutInfo.hidden_state` returns one in-process.
"""
from __future__ import annotations

import enum
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

import msgspec

PREFIX = "vllm_rl:"          # the carrier across the engine core's boundary (encode)
RECORD_FIELD = "rollout_info"  # the record's field: CompletionOutput and OpenAI choices


class Reason(str, enum.Enum):
    """Why a sample ended.  Values are stable strings (they cross the wire)."""

    EOS = "eos"                          # the model ended it (its EOS token)
    STOP = "stop"                        # a user stop string or stop token (vLLM's stop_reason)
    LENGTH = "length"                    # max_tokens or max_model_len
    ABORT = "abort"                      # aborted by the client
    DARTS_CANCELLED = "darts_cancelled"  # its group had its M shortest (DARTS Alg. 2 l.12)
    DUET_TRIMMED = "duet_trimmed"        # its answer marker fired: ended, answer complete
    DUET_ABORTED = "duet_aborted"        # no marker by K2 + G and its coin said abort (Eq. 5)
    ARROL_PRUNED = "arrol_pruned"        # pruned at l_detect by its score and coin (ARRoL Eq. 2)
    CARRIED = "carried"                  # its step ended first: to be continued next step
    STALE = "stale"                      # carried past partial.max_staleness: dropped

    @property
    def early(self) -> bool:
        """Ended by an RL technique before the model finished it (a carried sample is
        not: it goes on in the next step)."""
        return self not in (Reason.EOS, Reason.STOP, Reason.LENGTH, Reason.ABORT,
                            Reason.CARRIED)

    @property
    def natural(self) -> bool:
        """Ended by itself or at the response limit: its length is the model's own
        (capped), the lengths a regime's quantiles read (:mod:`vllm_rl.regime`)."""
        return self in (Reason.EOS, Reason.STOP, Reason.LENGTH)

    @property
    def valid(self) -> bool:
        """The sample holds a complete answer (the model's end, or a fired marker)."""
        return self in (Reason.EOS, Reason.STOP, Reason.DUET_TRIMMED)


@dataclass(frozen=True)
class RolloutInfo:
    """The outcome record of one sample.

    ``weight`` is the sample's importance weight for the loss (0 for samples that do not
    enter the training group).  ``finish_rank`` is the 1-based order in which the
    sample's group members ended (cancelled ones have none).  ``selected`` says whether
    it belongs to the M-sample training group, ``selection`` whether as one of the
    ``"short"`` or ``"long"`` end (DARTS dual-end), ``"shortest"`` (early stop) or
    ``"eps_kept"`` (DUET's coin kept it past the gate: in the group beside the M,
    :attr:`eps_kept`).
    DUET samples kept after the gate have ``keep_prob = eps`` and weight ``1/eps``;
    aborted ones weight 0.  ARRoL samples scored at ``l_detect`` carry the head's
    ``score``, the calibrated ``q``, the survival probability ``p`` (None in the cold
    start), the ``head_version``, whether they were ``pruned`` (then reason
    ``arrol_pruned``, weight 0), their ``trace`` features (mean and minimum token
    log-probability and mean entropy of the first ``l_detect`` tokens) and ``floor``
    when it was scored while its DARTS group was at M (kept whatever its coin said: no
    coin decided it, so its survival weight is 1, not 1/p).  DAS samples count the
    draft tokens they were verified on (``draft_proposed``) and how many the model accepted
    (``draft_accepted``), the steps in which they were verified on drafts
    (``draft_rounds``) and the engine steps of their life in which DAS drafted for no
    sample (``draft_off_steps``: its cost cap switches drafting off where verification
    would cost more than it saves, :mod:`vllm_rl.das.engine`); their tokens are the
    model's own either way.

    ``weight_version`` is the engine's count of weight syncs (prefix-cache resets,
    ``RLSchedulerMixin.reset_prefix_cache``) when the sample's first token was made.  A
    sample that ran across a sync (a reload in ``keep`` mode, or a framework's sync
    while it was in flight) also has ``weight_versions``: ``[[v0, 0], [v1, i1], ...]``,
    tokens ``[i_k, i_{k+1})`` sampled under version ``v_k``.  From ``i1`` on its KV was
    recomputed on the new weights; the tokens before ``i1`` came from the old policy.

    With partial rollouts (``partial`` flags) a record covers the whole sample: a
    continuation's ``length`` and ``weight_versions`` count the ``prior_tokens`` made in
    earlier steps, ``start_step`` is the step it started in, ``step`` the one it ended
    in, ``steps_crossed`` their difference.  A sample whose step ended first has reason
    ``carried`` (its tokens so far returned, to be sent again as a continuation), one
    carried past ``partial.max_staleness`` reason ``stale`` (dropped).
    """

    reason: Reason
    length: int
    weight: float = 1.0
    group_id: str | None = None
    finish_rank: int | None = None
    selected: bool | None = None
    selection: str | None = None
    stop: str | int | None = None        # vLLM's own stop_reason (stop string/token)
    marker_pos: int | None = None        # DUET: tokens generated when the marker fired
    keep_prob: float | None = None       # DUET: p_abort of Eq. 6 (eps after the gate, else 1)
    k1: int | None = None                # DUET: the thresholds this sample ran with
    k2: int | None = None
    gate_open: bool | None = None        # DUET: its gate could abort (False: duet.regime_gate
                                         # found the regime outside the paper's, eps = 1)
    markerless_share: float | None = None  # DUET: the kind's share reaching K2 + G with no
                                         # marker at its admission (None: too few samples)
    draft_proposed: int | None = None    # DAS: draft tokens this sample was verified on
    draft_accepted: int | None = None    # DAS: of which accepted by the model
    draft_rounds: int | None = None      # DAS: steps it was verified on at least one draft
    draft_off_steps: int | None = None   # DAS: engine steps of its life in which DAS drafted
                                         # for no sample (its cost cap had drafting off)
    score: float | None = None           # ARRoL: the head's score s' at l_detect
    q: float | None = None               # ARRoL: posterior P(correct | bin of s') (Eq. 1)
    p: float | None = None               # ARRoL: survival probability (Eq. 2)
    head_version: int | None = None      # ARRoL: the head version that scored it
    head_auc: float | None = None        # ARRoL: that head's held-out within-group AUC,
                                         # which opened the pruning gate (its calibration's)
    pruned: bool | None = None           # ARRoL: pruned at l_detect
    hidden: Any = field(default=None, compare=False, repr=False)   # ARRoL return_hidden:
                                         # the float32 vector at l_detect, in-process only
                                         # (taken with arrol_hidden; never on the wire)
    hidden_id: str | None = None         # ARRoL return_hidden: the key of its hidden state
                                         # kept on the worker (vllm_rl.arrol.hidden)
    trace: list[float] | None = None     # ARRoL: TRACE_FEATURES over the first l_detect tokens
    floor: bool | None = None            # ARRoL: scored while its DARTS group was at M, kept
                                         # whatever its coin said (composition rule)
    weight_version: int | None = None    # the engine's weight version of its first token
    weight_versions: list[list[int]] | None = None  # across weight syncs: [version, first
                                         # output-token index] per version, in order
    step: int | None = None              # partial rollouts: the step it ended in (or was
                                         # carried out of)
    start_step: int | None = None        # partial rollouts: the step it started in
    steps_crossed: int | None = None     # partial rollouts: step - start_step
    prior_tokens: int | None = None      # partial rollouts: tokens made in earlier steps
                                         # (the record's length counts them)

    def hidden_state(self):
        """The final-norm hidden state at ``l_detect`` (``arrol.return_hidden``) as a
        float32 numpy vector, or None: not asked for, or not taken from the worker yet
        (the record then has only its ``hidden_id``; :func:`with_hidden`)."""
        return self.hidden

    def with_hidden(self, vector: Any) -> "RolloutInfo":
        """This record with its hidden state (a float32 vector) attached in-process."""
        import numpy as np

        return replace(self, hidden=np.asarray(vector, dtype=np.float32).reshape(-1))

    @property
    def natural(self) -> bool:
        """Ended by itself or at the response limit: its length is the model's own
        (capped), the lengths a regime's quantiles read (:mod:`vllm_rl.regime`)."""
        return self in (Reason.EOS, Reason.STOP, Reason.LENGTH)

    @property
    def valid(self) -> bool:
        """A complete answer: ended by the model or at its answer marker."""
        return self.reason.valid

    @property
    def eps_kept(self) -> bool:
        """DUET: past the gate with no marker and kept by its coin (``keep_prob`` = eps
        < 1, weight 1/eps, Eq. 6).  Inside a DARTS group such a sample stands for DUET's
        marker-less tail and is outside DARTS's pool (the composition rule,
        ``docs/ARCHITECTURE.md``): never counted toward M, cancelled or deselected.
        Only a sample that then ran to its natural end is: one that something else ended
        after the gate (ARRoL's coin, the client) is out of the loss and the baseline
        like any sample so ended (:data:`NOT_RUN_OUT`)."""
        return (self.keep_prob is not None and self.keep_prob < 1.0
                and self.reason not in NOT_RUN_OUT)

    # -- wire format ------------------------------------------------------------
    def to_json(self) -> dict:
        """The record as a JSON object: the fields set, never the hidden state (its
        ``hidden_id`` names it).  ``choices[i].rollout_info`` on the OpenAI server."""
        d = {name: v for name in _WIRE if (v := getattr(self, name)) is not None}
        d["reason"] = self.reason.value
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RolloutInfo":
        """A record from :meth:`to_json`'s object (unknown keys ignored)."""
        kw = {k: v for k, v in d.items() if k in _WIRE_SET}
        kw["reason"] = Reason(d["reason"])
        return cls(**kw)

    def encode(self) -> str:
        """The carrier across the engine core's process boundary: ``"vllm_rl:"`` +
        compact JSON (:meth:`to_json`), in the finished request's ``stop_reason`` until
        the front end takes it out (module docstring)."""
        return PREFIX + _COMPACT.encode(self.to_json()).decode()

    @staticmethod
    def carrier(**values: Any) -> str:
        """``RolloutInfo(**values).encode()``, without building the record: the
        scheduler writes one per sample as it ends (:mod:`vllm_rl.engine.records`).  The
        same fields in the same order, the same defaults; a name that is not a wire
        field, or a missing ``reason`` or ``length``, raises ``TypeError`` as the
        constructor does."""
        if not values.keys() <= _WIRE_SET or not values.keys() >= _REQUIRED:
            raise TypeError("RolloutInfo.carrier: unknown fields "
                            f"{sorted(values.keys() - _WIRE_SET)}, missing "
                            f"{sorted(_REQUIRED - values.keys())}")
        get = values.get
        d = {name: v for name in _WIRE
             if (v := get(name, _SET_DEFAULTS.get(name))) is not None}
        d["reason"] = values["reason"].value
        return PREFIX + _COMPACT.encode(d).decode()

    @classmethod
    def decode(cls, carrier: Any) -> "RolloutInfo | None":
        """The record in an :meth:`encode` carrier, or None for anything else."""
        if not isinstance(carrier, str) or not carrier.startswith(PREFIX):
            return None
        return cls.from_json(msgspec.json.decode(carrier[len(PREFIX):]))

    @classmethod
    def from_completion(cls, completion: Any) -> "RolloutInfo":
        """From a vLLM ``CompletionOutput``: its ``rollout_info``, or for a request
        without flags the outcome vLLM's own fields tell."""
        info = record_of(completion)
        if info is not None:
            return info
        return cls(reason=_stock_reason(completion.finish_reason, completion.stop_reason),
                   length=len(completion.token_ids), stop=completion.stop_reason)

    @classmethod
    def from_openai_choice(cls, choice: dict) -> "RolloutInfo":
        """From one ``choices[i]`` of an OpenAI-compatible completion response: its
        ``rollout_info``, or for a request without flags what vLLM's fields tell."""
        record = choice.get(RECORD_FIELD)
        if record is not None:
            return cls.from_json(record)
        tokens = choice.get("token_ids") or []
        return cls(reason=_stock_reason(choice.get("finish_reason"), choice.get("stop_reason")),
                   length=len(tokens), stop=choice.get("stop_reason"))


def record_of(completion: Any) -> RolloutInfo | None:
    """A ``CompletionOutput``'s record (``rollout_info``), None for a request without
    flags."""
    return getattr(completion, RECORD_FIELD, None)


_IN_PROCESS = frozenset({"hidden"})      # fields that never cross the wire
# The wire fields in declaration order (to_json's order); the required ones; the
# defaults that are not None (what RolloutInfo.carrier fills in)
_WIRE = tuple(f.name for f in fields(RolloutInfo) if f.name not in _IN_PROCESS)
_WIRE_SET = frozenset(_WIRE)
_REQUIRED = frozenset(f.name for f in fields(RolloutInfo)
                      if f.default is MISSING and f.default_factory is MISSING)
_SET_DEFAULTS = {f.name: f.default for f in fields(RolloutInfo)
                 if f.name in _WIRE_SET and f.default not in (None, MISSING)}
# Compact JSON, as json.dumps(..., separators=(",", ":")) writes it (the same text for the
# finite values a record holds), in a tenth of its time: the scheduler writes a record
# per finished sample (benchmarks/record_carrier.py)
_COMPACT = msgspec.json.Encoder()
# The ends after which a sample past DUET's gate is not DUET's kept tail: its own coin
# aborted it, ARRoL's coin pruned it, the client aborted it (DARTS never cancels it).
NOT_RUN_OUT = frozenset({Reason.DUET_ABORTED, Reason.ARROL_PRUNED, Reason.ABORT,
                         Reason.DARTS_CANCELLED, Reason.STALE})


def token_spans(spans: Sequence[Sequence[int]], length: int) -> list[list[int]]:
    """Weight-version spans ``[[v0, 0], [v1, i1], ...]`` cut to those that hold a token
    of a ``length``-token sample: span k holds tokens ``[i_k, i_{k+1})``, so a span that
    starts where the next one does (two syncs with no token between) or at ``length``
    or later (a sync, or a continuation's admission, after its last token) holds none
    and goes; neighbours of one version join.  What is left is ``0 = i0 < i1 < ... <
    length``, each version's first token, which a continuation's
    ``partial.prior_versions`` takes back as it is.  A sample with no token keeps its
    first span."""
    out: list[list[int]] = []
    for v, i in spans:
        if out and i >= length:
            continue                    # after the sample's last token: holds none
        if out and i <= out[-1][1]:
            out.pop()                   # the span before holds none: this one replaces it
        if out and out[-1][0] == v:
            continue                    # the same weights go on
        out.append([v, 0 if not out else i])
    return out


def hidden_ids(infos: Sequence[RolloutInfo | None]) -> list[str]:
    """The ids of the hidden states these records name and do not hold yet (to take with
    the ``arrol_hidden`` RPC), each once, in order."""
    ids = [i.hidden_id for i in infos
           if i is not None and i.hidden_id is not None and i.hidden is None]
    return list(dict.fromkeys(ids))


def with_hidden(infos: Sequence[RolloutInfo | None],
                vectors: Mapping[str, Any]) -> list[RolloutInfo | None]:
    """``infos`` with the hidden states of ``vectors`` (``arrol_hidden``'s answer: id ->
    vector, or the HTTP route's base64 texts) attached by ``hidden_id``; a record whose
    vector is absent (never kept, or dropped by the worker's bounded store) is unchanged."""
    out: list[RolloutInfo | None] = []
    for info in infos:
        vector = None if info is None or info.hidden_id is None else vectors.get(info.hidden_id)
        if vector is not None and info.hidden is None:
            info = info.with_hidden(decode_hidden(vector) if isinstance(vector, str) else vector)
        out.append(info)
    return out


def encode_hidden(vector: Any) -> str:
    """A hidden state as text, for the HTTP route's answer (``POST
    /vllm_rl/arrol/hidden``): base64 of float32 little-endian."""
    import base64

    import numpy as np

    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def decode_hidden(text: str):
    """A hidden state from the HTTP route's text (:func:`encode_hidden`): a float32 numpy
    vector."""
    import base64

    import numpy as np

    return np.frombuffer(base64.b64decode(text), dtype="<f4").astype(np.float32)


def _stock_reason(finish_reason: str | None, stop_reason: Any) -> Reason:
    if finish_reason == "length":
        return Reason.LENGTH
    if finish_reason == "abort":
        return Reason.ABORT
    return Reason.EOS if stop_reason is None else Reason.STOP
