"""Group-sticky, problem-affine routing for verl (``rollout.router_config_path``).

verl's default balancer is sticky per request id, and its agent loop gives every sample
its own id, so the samples of one prompt spread over the replicas.  DARTS needs a whole
group in one scheduler, and DAS trees live in the replica that drafted a problem before.
:class:`RLRouter` routes on the sample's flags (``sampling_params["extra_args"]``):

1. **Group**: the first sample of a group picks the replica; every later sample of that
   group (``group.id``) follows it while that replica is in the pool.
2. **Problem**: a group picks by rendezvous (highest-random-weight) hashing on its
   ``das.problem_id`` (else its group id) over the replicas in the pool, so a problem
   lands on the same replica step after step, and adding or removing one replica moves
   only the problems whose top choice changed (about 1/n of them), never the others.
3. **Bounded load**: a group skips a replica holding more than ``load_factor`` × the
   mean in-flight requests (+1) and takes the next one in its problem's rendezvous
   order (consistent hashing with bounded loads), so a hot problem set cannot pile up
   on one replica.  ``load_factor: null`` gives pure affinity.

Requests without vllm_rl flags (validation) are routed as verl's default does.  Hashes
are BLAKE2b of the ids (Python's ``hash`` differs between processes).

Use it with a YAML file (``rollout.router_config_path``)::

    router_class: vllm_rl.integrations.verl.router.RLRouter
    load_factor: 1.25           # optional; null = pure problem affinity
"""
from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from typing import Any

from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE, GlobalRequestLoadBalancer

from vllm_rl.flags import read_or_warn

logger = logging.getLogger(__name__)

ROUTER_CLS = "vllm_rl.integrations.verl.router.RLRouter"
LOAD_FACTOR = 1.25


def route_keys(sampling_params: dict | None,
               request_id: str | None = None) -> tuple[str | None, str | None]:
    """``(group id, problem key)`` of a sample's flags (``(None, None)`` without flags),
    read with the engine's reader (:func:`vllm_rl.flags.read`); a group the flags leave
    unnamed is the request's own.  Flags that do not read are logged once for the
    request, which is routed as one without flags (the server answers it with a 400)."""
    params = sampling_params or {}
    extra = params.get("extra_args")
    if not extra:
        return None, None
    rid = str(request_id) if request_id is not None else "unnamed"
    flags = read_or_warn(extra, rid, logger, n=params.get("n"), default_group_id=rid)
    if flags is None:
        return None, None
    group = flags.group.id if flags.group is not None else None
    problem = (flags.das.problem_id if flags.das is not None else None) or group
    return group, problem


def rendezvous_order(key: str, servers: list[str]) -> list[str]:
    """``servers`` by descending BLAKE2b(key, server) weight (the HRW order of ``key``)."""
    def weight(server: str) -> bytes:
        return hashlib.blake2b(f"{key}\x00{server}".encode(), digest_size=8).digest()

    return sorted(servers, key=weight, reverse=True)


class RLRouter(GlobalRequestLoadBalancer):
    """verl load balancer: group-sticky, problem-affine, load-bounded (module docstring)."""

    def __init__(self, servers: dict[str, Any], config: dict | None = None, *,
                 max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE,
                 full_determinism: bool = False) -> None:
        super().__init__(servers, max_cache_size=max_cache_size,
                         full_determinism=full_determinism)
        config = dict(config or {})
        self.load_factor = config.get("load_factor", LOAD_FACTOR)
        if self.load_factor is not None and not float(self.load_factor) >= 1.0:
            raise ValueError(f"router load_factor={self.load_factor!r}: allowed float >= 1 or null")
        self._max_groups = int(config.get("max_cache_size", max_cache_size))
        self._group_server: OrderedDict[str, str] = OrderedDict()

    def require_acquire_fields(self) -> list[str]:
        return ["sampling_params"]

    def acquire_server(self, request_id: str, sampling_params: dict | None = None,
                       **_) -> tuple[str, Any]:
        group, problem = route_keys(sampling_params, request_id)
        if problem is None:
            return super().acquire_server(request_id)
        server = self._group_server.get(group) if group is not None else None
        if server not in self._inflight_requests:
            server = self._choose(problem)
            if group is not None:
                self._group_server[group] = server
                while len(self._group_server) > self._max_groups:
                    self._group_server.popitem(last=False)
        else:
            self._group_server.move_to_end(group)
        self._inflight_requests[server] += 1
        return server, self._servers[server]

    def _choose(self, problem: str) -> str:
        servers = list(self._inflight_requests)
        if not servers:
            raise RuntimeError("No available servers in load balancer")
        order = rendezvous_order(problem, servers)
        if self.load_factor is None:
            return order[0]
        mean = sum(self._inflight_requests.values()) / len(servers)
        bound = self.load_factor * mean + 1
        for server in order:
            if self._inflight_requests[server] < bound:
                return server
        return order[0]                  # unreachable: some server is at or below the mean

    def server_of_group(self, group: str) -> str | None:
        return self._group_server.get(group)

    def clear_sticky_cache(self) -> dict:
        """verl clears sticky state at phase switches and when fully-async rebalances;
        group pins stay (a group in flight must not split; pins to a replica that left
        the pool are dropped at the next acquire), and problem affinity is a function
        of the pool, not a cache."""
        return {**super().clear_sticky_cache(), "pinned_groups": len(self._group_server)}

    def get_status(self) -> dict:
        return {**super().get_status(), "pinned_groups": len(self._group_server),
                "load_factor": self.load_factor}
