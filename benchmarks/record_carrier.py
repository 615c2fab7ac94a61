"""What a sample's record costs to cross the engine core's process boundary: the
``stop_reason`` carrier against a typed field appended to ``EngineCoreOutput``.

    python benchmarks/record_carrier.py [--records 1024] [--repeats 7]

The engine core sends each finished sample to the front end as a ``EngineCoreOutput``
(a ``msgspec`` struct, ``array_like``), in one ``EngineCoreOutputs`` a step, through
vLLM's ``MsgpackEncoder`` / ``MsgpackDecoder``.  Two ways for the record to ride along:

* **carrier** (what vllm_rl does, ``docs/ARCHITECTURE.md``, "Patches"): the scheduler
  writes ``RolloutInfo.carrier(...)`` (``"vllm_rl:" + compact JSON``) into the request's
  ``stop_reason``; the front end's ``RecordField`` patch decodes it
  (``RolloutInfo.decode``);
* **typed**: a subclass of ``EngineCoreOutput`` with one more field appended last (as vLLM
  appends ``spec_decode_metrics``), holding the record as a ``msgspec`` struct, decoded
  by a decoder typed with it, and turned into a ``RolloutInfo`` in the front end.

Each is timed per finished flagged sample on each side of the boundary: in the engine
core, building the outputs with their records and encoding them (the scheduler's
process, under the step); in the front end, decoding them and making each
``RolloutInfo``.  One typical record of an all + partial run (every technique's fields
set), best of ``--repeats``; the bytes on the wire per output too.
The same outputs without a record are timed as the baseline.  It measures the
serialisation only: what each costs in patches is in ``docs/ARCHITECTURE.md``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VALUES = dict(length=412, weight=1.0, group_id="g-1234-17", finish_rank=3, selected=True,
              selection="dual_end", marker_pos=301, keep_prob=1.0, k1=120, k2=360,
              draft_proposed=280, draft_accepted=171, draft_rounds=70, draft_off_steps=12,
              score=0.7312, q=0.61, p=0.84, head_version=9, head_auc=0.79, pruned=False,
              trace=[-0.412, -3.91, 1.204], weight_version=4, weight_versions=[[5, 388]],
              step=17, start_step=16, steps_crossed=1, prior_tokens=231)


def typed_classes():
    """The typed alternative: the record as a msgspec struct, appended last to a subclass
    of vLLM's ``EngineCoreOutput`` (and ``EngineCoreOutputs`` listing it)."""
    import msgspec
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs

    from vllm_rl.outcome import _WIRE

    fields = [(name, object, None) for name in _WIRE if name != "reason"]
    Record = msgspec.defstruct("Record", [("reason", str), *fields],
                               array_like=True, omit_defaults=True, gc=False)

    opts = dict(array_like=True, omit_defaults=True, gc=False)
    TypedOutput = msgspec.defstruct("TypedOutput", [("rollout_info", Record | None, None)],
                                    bases=(EngineCoreOutput,), **opts)
    TypedOutputs = msgspec.defstruct("TypedOutputs", [("outputs", list[TypedOutput], [])],
                                     bases=(EngineCoreOutputs,), **opts)
    return Record, TypedOutput, TypedOutputs


def measure(records: int, repeats: int) -> dict:
    import msgspec
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from vllm_rl.outcome import Reason, RolloutInfo

    Record, TypedOutput, TypedOutputs = typed_classes()
    enc = MsgpackEncoder()
    plain_dec, typed_dec = MsgpackDecoder(EngineCoreOutputs), MsgpackDecoder(TypedOutputs)
    base = dict(new_token_ids=[17], finish_reason=FinishReason.STOP)

    def none():
        return EngineCoreOutputs(outputs=[EngineCoreOutput(request_id=f"r{i}", **base)
                                          for i in range(records)])

    def none_front(got):
        return got.outputs

    def carrier():
        return EngineCoreOutputs(outputs=[EngineCoreOutput(
            request_id=f"r{i}", stop_reason=RolloutInfo.carrier(reason=Reason.CARRIED, **VALUES),
            **base) for i in range(records)])

    def carrier_front(got):
        return [RolloutInfo.decode(o.stop_reason) for o in got.outputs]

    def typed():
        return TypedOutputs(outputs=[TypedOutput(
            request_id=f"r{i}", rollout_info=Record(reason=Reason.CARRIED.value, **VALUES),
            **base) for i in range(records)])

    def typed_front(got):
        return [RolloutInfo.from_json({k: v for k, v in msgspec.structs.asdict(o.rollout_info)
                                       .items() if v is not None}) for o in got.outputs]

    out = {}
    for name, build, dec, front in (("none", none, plain_dec, none_front),
                                    ("carrier", carrier, plain_dec, carrier_front),
                                    ("typed", typed, typed_dec, typed_front)):
        core = front_ns = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            wire = enc.encode(build())
            t1 = time.perf_counter_ns()
            got = front(dec.decode(wire))
            t2 = time.perf_counter_ns()
            core, front_ns = min(core, t1 - t0), min(front_ns, t2 - t1)
        assert len(got) == records
        out[name] = {"core_us": core / records / 1e3, "front_us": front_ns / records / 1e3,
                     "bytes_per_output": sum(map(len, wire)) / records}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    res = measure(args.records, args.repeats)
    print("| record | engine core: build + encode (µs per finished output) | front end: "
          "decode + RolloutInfo (µs) | bytes per output |")
    print("|---|---|---|---|")
    for name, r in res.items():
        print(f"| {name} | {r['core_us']:.1f} | {r['front_us']:.1f} | "
              f"{r['bytes_per_output']:.0f} |")


if __name__ == "__main__":
    main()
