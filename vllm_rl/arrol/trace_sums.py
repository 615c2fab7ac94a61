"""The trace features' running sums of the samples not yet scored, on the device
(:class:`TraceSums`): a ``[3, slots]`` tensor (Σ log p, min log p, Σ entropy of each
sample's own tokens so far, :data:`vllm_rl.arrol.rule.TRACE_FEATURES`), one slot per
sample, fed after each step's sampling with the tokens the sample kept (a draft only if
accepted), read at ``l_detect`` by the scorer (:mod:`vllm_rl.arrol.scorer`).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from vllm_rl.arrol.step_plan import Plan
from vllm_rl.arrol.transfer import Transfer

SLOTS = 256                  # the first capacity (it doubles)


def token_logprob(plan: Plan, k: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """log p(tok) = z_tok − lse of tracked rows ``k`` (raw logits, before temperature)."""
    return plan.src[k, tok].float() - plan.lse.index_select(0, k)


class TraceSums:
    """The device sums and their slots (module docstring).  ``limit``: each slot's
    ``l_detect``; ``resets``: slots taken since the last step, zeroed in its one upload."""

    def __init__(self, device) -> None:
        self.device = device
        self.free: list[int] = []                  # slots free
        self.resets: list[int] = []                # slots to zero before use
        self.limit = np.zeros(0, dtype=np.int64)   # per slot: l_detect
        with torch.inference_mode():
            self.acc = torch.empty((3, 0), dtype=torch.float32, device=device)

    def take(self, limit: int) -> int:
        """A free slot for a sample with ``l_detect = limit``, zeroed before its first
        use (:meth:`take_resets`); the tensor doubles when none is free."""
        if not self.free:
            cap = self.acc.shape[1]
            new = max(SLOTS, 2 * cap)
            with torch.inference_mode():
                acc = torch.empty((3, new), dtype=torch.float32, device=self.device)
                acc[:, :cap] = self.acc
            self.acc = acc
            self.limit = np.concatenate([self.limit, np.zeros(new - cap, dtype=np.int64)])
            self.free.extend(range(new - 1, cap - 1, -1))
        slot = self.free.pop()
        self.resets.append(slot)
        self.limit[slot] = limit
        return slot

    def give_back(self, slot: int) -> None:
        """A sample scored or gone: its slot is free (zeroed when taken again)."""
        self.free.append(slot)

    def take_resets(self) -> list[int]:
        """The slots taken since the last call, to zero in this step's upload."""
        resets, self.resets = self.resets, []
        return resets

    def zero(self, reset_d: torch.Tensor) -> None:
        """Zero the sums of slots ``reset_d`` (on the device): min log p starts at +inf."""
        self.acc.index_fill_(1, reset_d, 0.0)
        self.acc[1].index_fill_(0, reset_d, math.inf)

    def add_sampled(self, plan: Plan, sampled, xfer: Transfer) -> None:
        """This step's kept tokens (host lists, after vLLM's sync): token k of a tracked
        sample came from its k-th logits row (a draft accepted, or the bonus / plain
        sampled token)."""
        if not sampled:
            return
        size = len(sampled)
        if int(plan.t_count.max()) == 1:               # one row each: no drafts
            tok = np.array([(s[0] if (s := sampled[i]) else -1) if i < size else -1
                            for i in plan.t_index.tolist()], dtype=np.int64)
            keep = tok >= 0
            ks, toks, slots = plan.t_k[keep], tok[keep], plan.t_slot[keep]
        else:
            ks, toks, slots = [], [], []
            for i, k, cnt, slot in zip(plan.t_index.tolist(), plan.t_k.tolist(),
                                       plan.t_count.tolist(), plan.t_slot.tolist()):
                got = sampled[i] if i < size else ()
                c = min(cnt, len(got))
                if c > 0:
                    ks.extend(range(k, k + c))
                    toks.extend(got[:c])
                    slots.extend([slot] * c)
        if len(ks):
            k_d, t_d, s_d = xfer.up(ks, toks, slots)
            self._add(plan, k_d, t_d, s_d)

    def add_sampled_async(self, plan: Plan, out, xfer: Transfer) -> None:
        """Async output: the sampled ids are a device tensor (``[rows, 1 + drafts]``, -1
        past a row's accepted tokens), read there: each tracked sample's first
        ``t_count`` columns, each kept where its token is the sample's own."""
        ids = getattr(out, "_sampled_token_ids", None)
        if ids is None:
            return
        keep = np.ones(len(plan.t_index), dtype=bool)
        bad = getattr(out, "_invalid_req_indices", None)
        if bad:
            keep &= ~np.isin(plan.t_index, np.asarray(bad, dtype=np.int64))
        if not keep.any():
            return
        ks, rows, slots = plan.t_k[keep], plan.t_index[keep], plan.t_slot[keep]
        count = plan.t_count[keep]
        width = min(int(count.max()), ids.shape[1])
        col = np.arange(width)
        # each (sample, column) pair: its logits row (the first where the column is past
        # the sample's tracked rows: masked below), its slot, whether it is tracked
        tracked = col[None, :] < count[:, None]
        k_d, i_d, s_d, m_d = xfer.up(
            np.where(tracked, ks[:, None] + col[None, :], ks[:, None]).ravel(),
            rows, np.repeat(slots, width), tracked.ravel())
        tok = ids.index_select(0, i_d.to(ids.device))[:, :width].reshape(-1).long()
        own = (tok >= 0) & m_d.to(tok.device).bool()
        self._add(plan, k_d, tok.clamp_min(0), s_d, own)

    def _add(self, plan: Plan, k, tok, slots, own=None) -> None:
        """Add tokens ``tok`` of tracked rows ``k`` to their slots' sums; ``own``: a mask,
        on the device, of the entries that count (None: all)."""
        lp = token_logprob(plan, k, tok)
        ent = plan.ent.index_select(0, k)
        low = lp
        if own is not None:
            low = lp.masked_fill(~own, math.inf)
            lp, ent = lp.masked_fill(~own, 0.0), ent.masked_fill(~own, 0.0)
        acc = self.acc
        acc[0].index_add_(0, slots, lp)
        acc[1].scatter_reduce_(0, slots, low, "amin")
        acc[2].index_add_(0, slots, ent)


__all__ = ["SLOTS", "TraceSums", "token_logprob"]
