"""Which nodes have a bind in flight, and who waits for a node's lock next.

A node's lock serialises the binds on it from the lock until the device plugin's
Allocate (HAMi v2.10), so a burst whose pods all go to one node (binpack does that: the
fullest node scores best) is served one pod at a time. :class:`InFlight` tracks the pods
this scheduler placed on a node whose bind has not finished; with the nodes whose lock
is held it tells the filter which nodes are busy, so it can place the next pod on the
best free node instead (:meth:`hami.scheduler.engine.Engine.filter`).

:class:`NodeWaiters` lets binds wait for a node change (from the node watch) in arrival
order: one change wakes the longest waiter only, not every bind queued on the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable


class InFlight:
    """Pods placed by ``/filter`` whose ``/bind`` has not finished, per node.

    ``ttl_s``: an entry older than this no longer counts (a bind that never came: the
    pod's scheduling was given up after the filter). Times are ``clock()`` seconds.
    """

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._node_of: dict[str, str] = {}
        self._by_node: dict[str, dict[str, float]] = {}

    def add(self, uid: str, node: str) -> None:
        """``uid`` was placed on ``node`` (a newer placement replaces an older one)."""
        self.done(uid)
        self._node_of[uid] = node
        self._by_node.setdefault(node, {})[uid] = self.clock()

    def done(self, uid: str) -> None:
        """``uid``'s bind finished (bound or failed), or the pod is gone."""
        node = self._node_of.pop(uid, None)
        if node is None:
            return
        pods = self._by_node.get(node)
        if pods is not None:
            pods.pop(uid, None)
            if not pods:
                del self._by_node[node]

    def counts(self) -> dict[str, int]:
        """Binds in flight per node, nodes without any left out (expired entries are
        dropped)."""
        cutoff = self.clock() - self.ttl_s
        out = {}
        for node, pods in list(self._by_node.items()):
            for uid in [u for u, at in pods.items() if at < cutoff]:
                self.done(uid)
            if pods:
                out[node] = len(pods)
        return out

    def __len__(self) -> int:
        return len(self._node_of)


class NodeWaiters:
    """Binds waiting for a change of a node, woken one at a time in arrival order.

    ``wait(node, seconds, ticket)`` returns on the first :meth:`changed` that picks it, or
    after ``seconds``. :meth:`changed` wakes the waiter with the lowest ticket only (the
    bind that has waited longest keeps its place while it retries): it finds the lock
    free and takes it, and its own lock write is the next change, which wakes the next
    waiter; waiters that time out retry on their own, so a missed wake-up costs at most
    one back-off.
    """

    def __init__(self) -> None:
        self._waiting: dict[str, dict[int, asyncio.Future[None]]] = {}
        self._tickets = itertools.count()

    def ticket(self) -> int:
        """A place in line, taken once per bind before its first wait."""
        return next(self._tickets)

    async def wait(self, node: str, seconds: float, ticket: int) -> None:
        """Until ``node`` changes and this is the longest waiter, or ``seconds`` pass."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting.setdefault(node, {})
        queue[ticket] = future
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, seconds)
        finally:
            if queue.get(ticket) is future:
                del queue[ticket]
            if not queue and self._waiting.get(node) is queue:
                del self._waiting[node]

    def changed(self, node: str) -> None:
        """``node`` changed (a watch event): wake its longest waiter, if any."""
        queue = self._waiting.get(node)
        if not queue:
            return
        ticket = min(queue)
        future = queue.pop(ticket)
        if not future.done():
            future.set_result(None)

    def waiting(self, node: str) -> int:
        """How many binds wait on ``node`` now."""
        return len(self._waiting.get(node) or ())
