"""Partial rollouts on OpenRLHF: the settings' ``partial`` (APRIL across the rollout
actors).

:class:`RLSamplesGenerator` is OpenRLHF's ``SamplesGenerator`` with one method changed,
``_generate_vllm`` (one rollout of ``num_prompts`` prompts).  The launcher puts it in
place of ``openrlhf.trainer.ppo_trainer.SamplesGenerator`` in the trainer's Ray worker
(:func:`.launcher.setup_worker`).  With ``partial`` set, each call is one step:

1. the groups carried from earlier steps go first: their carried samples through
   ``continue_responses`` on a rollout actor (OpenRLHF's executor runs each as a sample;
   the engine gets the prompt and the tokens so far).  Then the new prompts go through
   ``generate_responses`` with the step's ``partial`` flags.  The actors are chosen by
   load, as OpenRLHF's ``_dispatch_prompts_to_vllm`` does;
2. as groups come back, the generator counts the complete ones (no sample carried).  Once
   ``ceil(launched / over)`` are (or ``time_s`` has passed with one), it ends the step on
   every actor (``end_step``: the engine-core utility ``vllm_rl_end_step``), and the
   samples still generating come back ``carried``;
3. the complete groups are marked whole (:func:`.records.attach`) and become
   experiences, ``n_samples_per_prompt`` consecutive per group as OpenRLHF's advantage
   reshape needs.  The others stay in the buffer, each sample's response dict with it
   (``Part.extra``).  The buffer changes here, once the experiences are made
   (``CarryBuffer.commit``): a step that fails before leaves every carried sample in it.

The loss takes the samples as they are (``loss="as_is"``, APRIL).  ``loss="tis"`` is
OpenRLHF's own token-level importance-sampling correction over each token's rollout
logprob, which a continued sample carries for its earlier tokens too
(``--algo.advantage.is_correction_level token``); the generator refuses ``tis`` without
it.  :meth:`RLSamplesGenerator.state_dict` / ``load_state_dict`` keep the buffer (plain
JSON for text prompts); a generator that starts without it has nothing carried.
"""
from __future__ import annotations

import heapq
import json
import time
from typing import Any

from openrlhf.trainer.ppo_utils.samples_generator import (
    SamplesGenerator,
    _collect_prompt_batch,
)

from vllm_rl.integrations.common.partial import (
    CarriedGroup,
    CarryBuffer,
    Part,
    PartialConfig,
    continuation,
    staleness,
)
from vllm_rl.integrations.openrlhf import FLAGS_KEY, HIDDEN_KEY, RECORD_KEY, load_settings
from vllm_rl.flags import read_step
from vllm_rl.outcome import RolloutInfo

STALENESS = "vllm_rl/diag/{}"        # the step's staleness in every sample's info


def part_of(response: dict) -> Part:
    """An OpenRLHF response dict as a :class:`Part`: its action tokens and their rollout
    logprobs (0 where OpenRLHF asked for none), its record; the dict kept in ``extra``."""
    tokens = response["observation_tokens"]
    info = RolloutInfo.decode(response.get(RECORD_KEY))
    # a sample out of the loss has no action range: its tokens are the last ``length``
    start, end = (response.get("action_ranges")
                  or [(len(tokens) - (info.length if info else 0), len(tokens))])[0]
    lps = response.get("rollout_log_probs")
    return Part(list(tokens[start:end]), list(lps[start:end]) if lps else [0.0] * (end - start),
                info, extra=response)


class RLSamplesGenerator(SamplesGenerator):
    """OpenRLHF's ``SamplesGenerator`` with partial rollouts (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rl_partial = PartialConfig.of(load_settings().get("partial"))
        self.rl_buffer = CarryBuffer()
        self.rl_step = 0
        if self.rl_partial is not None and self.rl_partial.loss == "tis":
            level = self.args.algo.advantage.is_correction_level
            if level != "token":
                raise ValueError("partial.loss=tis is OpenRLHF's token-level correction: "
                                 f"--algo.advantage.is_correction_level token (got {level!r})")

    rl_evaluating = False

    def generate_eval_samples(self, **generate_kwargs):
        """OpenRLHF's evaluation, as on stock (no step, nothing carried)."""
        self.rl_evaluating = True
        try:
            return super().generate_eval_samples(**generate_kwargs)
        finally:
            self.rl_evaluating = False

    def _generate_vllm(self, dataloader_iter, num_prompts: int, dynamic_filtering,
                       **generate_kwargs):
        if self.rl_partial is None or self.rl_evaluating:
            return super()._generate_vllm(dataloader_iter, num_prompts, dynamic_filtering,
                                          **generate_kwargs)
        if dynamic_filtering:
            raise ValueError("partial rollouts with OpenRLHF's dynamic filtering: a "
                             "filtered group would be replaced across steps; not supported")
        cfg, self.rl_step = self.rl_partial, self.rl_step + 1
        step = self.rl_step
        prompts, labels, images, exhausted = _collect_prompt_batch(dataloader_iter, num_prompts)
        going, done = self.rl_buffer.take(step, cfg.max_staleness)
        if not prompts and not going and not done:
            return [], 0, True
        n = self.args.rollout.n_samples_per_prompt
        max_len = generate_kwargs.get("max_len", 2048)
        max_new = generate_kwargs.get("max_new_tokens") or max_len
        launched = len(going) + len(prompts)
        rule = cfg.rule(step, launched, sum(len(g.carried) for g in going) + n * len(prompts),
                        max_new, by_engine=False)
        params = self._rl_sampling_params(generate_kwargs)
        engines = self._rl_engines(len(going) + len(prompts), n)
        pending: dict[Any, Any] = {}
        for g in going:
            members = []
            for part in g.carried:
                _, flags, _, seed = continuation(g, part, step, rule, max_new)
                sent = Part(part.token_ids, part.logprobs, part.info, part.seed, part.text)
                members.append({"part": sent.to_json(), "flags": flags, "seed": seed})
            ref = next(engines).continue_responses.remote(
                prompt=g.row["prompt"], label=g.row["label"], sampling_params=params,
                max_length=max_len, hf_tokenizer=self.tokenizer, members=members,
                images=g.row.get("images"))
            g.carried = []
            pending[ref] = g
        for prompt, label, image in zip(prompts, labels, images):
            ref = next(engines).generate_responses.remote(
                prompt=prompt, label=label, sampling_params=params, max_length=max_len,
                hf_tokenizer=self.tokenizer, num_samples=n, images=image,
                vllm_rl_partial=rule)
            pending[ref] = {"prompt": prompt, "label": label, "images": image}
        complete, carried = list(done), []
        need, started, ended = cfg.need(launched) + len(done), time.monotonic(), False
        while pending:
            ready, _ = self._rl_wait(list(pending), cfg.time_s, started)
            for ref in ready:
                group = self._rl_group(pending.pop(ref), self._rl_get(ref), step, n)
                (carried if group.carried else complete).append(group)
            late = cfg.time_s is not None and time.monotonic() - started >= cfg.time_s
            if not ended and (len(complete) >= need or (complete and late)):
                self._rl_end_step(step)
                ended = True
        experiences = self._rl_experiences(complete, generate_kwargs)
        self.rl_buffer.commit(carried)      # all or nothing: the step's results are in
        return experiences, len(prompts), exhausted

    # -- one step's parts ---------------------------------------------------------------
    def _rl_sampling_params(self, generate_kwargs: dict):
        """The sampling parameters OpenRLHF's ``_dispatch_prompts_to_vllm`` builds."""
        from vllm import SamplingParams

        return SamplingParams(
            temperature=generate_kwargs.get("temperature", 1.0),
            top_p=generate_kwargs.get("top_p", 1.0),
            top_k=generate_kwargs.get("top_k", -1),
            max_tokens=generate_kwargs.get("max_new_tokens"),
            min_tokens=generate_kwargs.get("min_new_tokens", 1),
            skip_special_tokens=generate_kwargs.get("skip_special_tokens", False),
            logprobs=1 if self.args.algo.advantage.is_correction_level != "off" else None)

    def _rl_engines(self, calls: int, n: int):
        """The actors by load, as ``_dispatch_prompts_to_vllm`` balances them."""
        import ray

        counts = ray.get([e.get_num_unfinished_requests.remote() for e in self.vllm_engines])
        heap = [(c, i) for i, c in enumerate(counts)]
        heapq.heapify(heap)
        for _ in range(calls):
            load, i = heapq.heappop(heap)
            heapq.heappush(heap, (load + n, i))
            yield self.vllm_engines[i]

    @staticmethod
    def _rl_wait(refs: list, limit: float | None, started: float):
        import ray

        timeout = None if limit is None else max(0.0, limit - (time.monotonic() - started))
        return ray.wait(refs, num_returns=1, timeout=timeout)

    @staticmethod
    def _rl_get(ref):
        import ray

        return ray.get(ref)

    def _rl_end_step(self, step: int) -> None:
        import ray

        step = read_step(step)             # refused here, before any actor sees it
        ray.get([e.end_step.remote(step) for e in self.vllm_engines])

    def _rl_group(self, launched: Any, responses: list[dict], step: int,
                  n: int) -> CarriedGroup:
        """A launched group's responses as a :class:`CarriedGroup` (complete when none of
        its samples was carried): a continued group's new parts beside its earlier ones."""
        parts = [part_of(r) for r in responses]
        if isinstance(launched, CarriedGroup):
            group = launched
        else:
            flags = json.loads(responses[0].get(FLAGS_KEY) or "null")
            first = responses[0]
            start = (first.get("action_ranges") or [(len(first["observation_tokens"]),)])[0][0]
            info = next((p.info for p in parts if p.info is not None), None)
            group = CarriedGroup(
                prompt=launched["prompt"], prompt_ids=list(first["observation_tokens"][:start]),
                flags=flags, group_id=info.group_id if info is not None else None,
                size=int(((flags or {}).get("group") or {}).get("size") or n), redundant=n,
                start_step=step, row=launched)
        for part in parts:
            group.add(part)
        if not isinstance(launched, CarriedGroup) and not group.carried:
            group.row = dict(launched, marked=True)     # the actor marked it whole
        return group

    def _rl_experiences(self, groups: list[CarriedGroup], generate_kwargs: dict) -> list:
        """The complete groups marked whole, then OpenRLHF's experiences (each group's
        samples consecutive); the step's staleness in every sample's info."""
        import torch

        from vllm_rl.integrations.openrlhf.records import attach

        responses, parts = [], []
        for g in groups:
            parts += g.ended
            if g.row.get("marked"):
                responses += [p.extra for p in g.ended]
                continue
            members = []
            for part in g.ended:
                response = dict(part.extra)
                response[RECORD_KEY] = part.info.encode()   # a stale drop's own record
                members.append(response)
            hidden = [r.get(HIDDEN_KEY) for r in members]   # never in a record's wire
            attach(members, [p.info for p in g.ended], g.flags)
            for response, vector in zip(members, hidden):
                if vector is not None:
                    response[HIDDEN_KEY] = vector
            responses += members
        diag = staleness(p for p in parts if p.info is not None)
        experiences = [self._process_response_into_experience(r, **generate_kwargs)
                       for r in responses]
        for e in experiences:
            for name, value in diag.items():
                e.info[STALENESS.format(name)] = torch.tensor([float(value)])
        return experiences

    # -- a restart ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"step": self.rl_step, "buffer": self.rl_buffer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.rl_step = int(state.get("step", 0))
        self.rl_buffer.load_state_dict(state.get("buffer", {}))


__all__ = ["RLSamplesGenerator", "part_of"]
