"""``/prioritize`` in DRA mode: the extender verb kube-scheduler calls after its own
filtering (configure the extender with ``prioritizeVerb: prioritize`` and no filter or
bind verb). Answers :func:`hami.dra.policy.node_scores` for the candidate nodes from the
watched ResourceSlices and ResourceClaims (:class:`hami.dra.cache.DraObjects`); until
their first list has arrived, or with ``watch=False``, each call lists both kinds.
``fragmentation-aware`` answers :class:`hami.dra.fragscore.DraFragmentation` from the
same objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hami.dra import policy
from hami.dra.cache import DraObjects
from hami.dra.fragscore import DraFragmentation
from hami.dra.hosts import HostUsage
from hami.extender.wire import WireError, parse_filter_args

#: The node policies of DRA mode's ``/prioritize``.
POLICIES = (*policy.POLICIES, "fragmentation-aware")


class DraPrioritizer:
    """Callable ``body -> HostPriorityList``; ``client`` is a lightkube ``AsyncClient``,
    ``node_policy`` ``binpack``, ``spread`` or ``fragmentation-aware`` (the scheduler's
    ``--node-scheduler-policy``).
    A malformed body is an empty list (kube-scheduler then ignores this extender's scores).
    ``watch``: read the cluster from :meth:`hami.dra.cache.DraObjects.shared` (started on
    the first call) instead of listing on every call. ``hosts``: the nodes' CPU and
    memory for ``fragmentation-aware`` (:class:`hami.dra.hosts.HostUsage`). ``steer``:
    ``(pod, scores) -> scores`` applied last (DRA-mode preemption's reservations,
    :meth:`hami.scheduler.drapreempt.DraPreemption.steer`).

    Raises:
        ValueError: ``node_policy`` is not one of :data:`POLICIES`.
    """

    def __init__(self, client: Any, node_policy: str, *, watch: bool = True,
                 hosts: HostUsage | None = None,
                 steer: Callable[[dict[str, Any], list[dict[str, Any]]],
                                 list[dict[str, Any]]] | None = None) -> None:
        if node_policy not in POLICIES:
            raise ValueError(f"unknown node policy {node_policy!r}")
        self.client = client
        self.node_policy = node_policy
        self.watch = watch
        self.steer = steer
        self.fragmentation = (DraFragmentation(hosts=hosts)
                              if node_policy == "fragmentation-aware" else None)

    async def __call__(self, body: bytes) -> list[dict[str, Any]]:
        """Scores for the nodes of the ExtenderArgs in ``body``."""
        try:
            args = parse_filter_args(body)
        except WireError:
            return []
        names = args.node_names if args.node_names is not None else [
            str((n.get("metadata") or {}).get("name")) for n in args.nodes or []]
        scores = await self._scores(args.pod, names)
        return scores if self.steer is None else self.steer(args.pod, scores)

    async def _scores(self, pod: dict[str, Any], names: list[str]) -> list[dict[str, Any]]:
        from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

        if self.fragmentation is not None:
            return await self._fragmentation(pod, names)
        use = DraObjects.shared(self.client).memory_use() if self.watch else None
        if use is None:
            slices = [s.to_dict() async for s in self.client.list(ResourceSlice)]
            claims = [c.to_dict() async for c in self.client.list(ResourceClaim, namespace="*")]
            use = policy.memory_use(slices, claims)
        return policy.node_scores(names, use, self.node_policy)

    async def _fragmentation(self, pod: dict[str, Any], names: list[str]
                             ) -> list[dict[str, Any]]:
        from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

        assert self.fragmentation is not None
        objs = DraObjects.shared(self.client) if self.watch else None
        if objs is not None and all(e.is_set() for e in objs.synced.values()):
            return self.fragmentation(pod, names, objs.slices, objs.claims, objs.version)
        slices = [s.to_dict() async for s in self.client.list(ResourceSlice)]
        claims = [c.to_dict() async for c in self.client.list(ResourceClaim, namespace="*")]
        return self.fragmentation(pod, names, slices, claims)
