"""A weight sync in the RL scheduler: the prefix-cache reset after which no request reads
KV computed with older weights, and the weight version each flagged sample's record
names (``docs/ARCHITECTURE.md``, "Weight syncs and the prefix cache").

:class:`WeightSyncMixin` sits under :class:`~vllm_rl.engine.scheduler.RLSchedulerMixin`
on vLLM's scheduler; it reads the scheduler's flagged samples (``rl_members``).
"""
from __future__ import annotations

from vllm.logger import init_logger

logger = init_logger(__name__)


class WeightSyncMixin:
    """vLLM's ``reset_prefix_cache`` as a weight sync (:meth:`reset_prefix_cache`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Weight syncs seen (every prefix-cache reset is one) and the last one's report.
        self.rl_weight_version = 0
        self.rl_last_sync: dict | None = None

    def reset_prefix_cache(self, reset_running_requests: bool = False,
                           reset_connector: bool = False) -> bool:
        """A weight sync: after it, no request reads KV computed with older weights.

        verl, OpenRLHF, TRL and :mod:`vllm_rl.weights` reset the prefix cache at every
        weight sync.  vLLM's reset refuses (and logs it) while requests hold blocks,
        which leaves every cached block of the old weights open to new hits.  Here the
        requests holding blocks are always preempted first, as vLLM's own
        ``pause_generation(clear_cache=True)`` does (``reset_running_requests``): their
        blocks are freed, the cache is emptied, and they resume by recomputing their
        prompt and tokens so far on the new weights.  So the reset succeeds (vLLM itself
        raises where a KV-connector transfer is still pending), and a block cached
        afterwards was computed afterwards.  Any reset counts as a sync, a user's own
        included: the cost is a recompute and a version step, never old KV.  With no
        request running, nothing is preempted and the call is vLLM's own: a reset that
        fails (the KV cache manager's or the connector's) answers ``False``, as vLLM
        answers it.

        The sync bumps :attr:`rl_weight_version`; a flagged sample with tokens from
        before it says in its record where the new version began
        (``RolloutInfo.weight_versions``).  :attr:`rl_last_sync` reports what happened
        (read by the ``vllm_rl_weight_sync`` utility, ``patches/engine_core.py``).
        """
        recomputed = sum(1 for r in self.running if r.num_computed_tokens > 0)
        cached = _cached_blocks(self.kv_cache_manager)
        ok = super().reset_prefix_cache(reset_running_requests or bool(self.running),
                                        reset_connector)
        self.rl_weight_version += 1
        version, across = self.rl_weight_version, 0
        for rid, member in self.rl_members.items():
            request = self.requests.get(rid)
            n = request.num_output_tokens if request is not None else 0
            if n == 0:
                member.weight_version = version     # no token from the old weights
            else:
                member.version_starts += ((version, n),)
                across += 1
        self.rl_last_sync = {"weight_version": version, "prefix_cache_reset": ok,
                             "cached_blocks_dropped": cached,
                             "requests_recomputed": recomputed,
                             "flagged_samples_across": across}
        logger.info("weight sync %d: prefix cache reset (%s cached blocks dropped), %d "
                    "requests in flight recomputed on the new weights", version, cached,
                    recomputed)
        return ok


def _cached_blocks(kv_cache_manager) -> int | None:
    """Blocks in the prefix cache's hash map (None where vLLM's layout differs)."""
    pool = getattr(kv_cache_manager, "block_pool", None)
    table = getattr(pool, "cached_block_hash_to_block", None)
    try:
        return len(table)
    except TypeError:
        return None


__all__ = ["WeightSyncMixin"]
