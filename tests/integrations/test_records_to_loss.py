"""Real engine records into each trainer's loss: TRL, verl and OpenRLHF agree.

One step on the RL engine with DARTS (early stop, M = 4 of 8) and DUET's gate inside it
at eps = 0.5, so groups hold their M and, beside them, eps-kept samples.  The records and
flags then go through each drop-in's own path: TRL's rows (RolloutFunc's slots), verl's
``training_marks`` over ``extra_fields``, OpenRLHF's ``attach`` over its response dicts.
Every sample the records keep reaches each loss with its weight, every sample they put
in the baseline is in each baseline, no eps-kept sample is dropped.
"""
from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

MARKER = r"\\boxed\{[^}]*\}"


def test_every_trainer_keeps_what_the_records_keep(das_llm):
    from vllm_rl.integrations import openrlhf, verl
    from vllm_rl.integrations.openrlhf.records import BASELINE, KEEP, WEIGHT, attach
    from vllm_rl.integrations.trl.rollout import RolloutFunc
    from vllm_rl.integrations.verl.loss import training_marks as verl_marks
    from vllm_rl.outcome import RolloutInfo
    from vllm_rl.task import train_prompts

    m = 4
    flags = {"darts": {"mode": "shortest"},
             "duet": {"pattern": MARKER, "k1": 8, "k2": 16, "grace": 8, "eps": 0.5}}
    rollout = RolloutFunc(das_llm, flags, redundant=8, max_tokens=96, seed=17,
                          sync_weights=False)
    prompts = [p for p in train_prompts(24)[16:24] for _ in range(m)]
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=0))
    slots = rollout.prepare(prompts, trainer)
    rows = rollout([p for p in rollout.last.prompts for _ in range(slots)], trainer)
    trl_marks = rollout.last_marks

    def triples(marks):
        return Counter((mk.keep, round(mk.weight, 6), mk.baseline) for mk in marks
                       if mk.keep or mk.baseline)

    eps_kept = 0
    for g, (infos, f) in enumerate(zip(rollout.last.infos, rollout.last.flags)):
        reference = rollout.last.marks[g]
        eps_kept += sum(mk.eps_kept for mk in reference)
        trl = trl_marks[g * slots:(g + 1) * slots]
        wire = json.dumps(f)
        raw = [i.encode() for i in infos]          # the records as they cross the wire
        ver = verl_marks([{verl.RECORD_KEY: r, verl.FLAGS_KEY: wire} for r in raw])
        responses = attach([{"action_ranges": [(0, i.length)]} for i in infos],
                           [RolloutInfo.decode(r) for r in raw], f)
        orl = [SimpleNamespace(keep=bool(r["extra_logs"][KEEP]),
                               weight=r["extra_logs"][WEIGHT] if r["extra_logs"][KEEP] else 0.0,
                               baseline=bool(r["extra_logs"][BASELINE])) for r in responses]
        assert triples(trl) == triples(ver) == triples(orl) == triples(reference)
        assert all((r["action_ranges"] == []) == (not mk.keep)
                   for r, mk in zip(responses, reference))
        assert [mk.eps_kept for mk in ver] == [mk.eps_kept for mk in reference]
    assert eps_kept, "a group held an eps-kept sample beside its M (not vacuous)"
    assert len(rows["completion_ids"]) == slots * len(rollout.last.prompts)
    assert openrlhf.RECORD_KEY == verl.RECORD_KEY == "vllm_rl"
