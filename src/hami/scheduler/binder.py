"""Node lock acquisition and release against the API (HAMi v2.10, B01, B02).

The decisions are :mod:`hami.scheduler.nodelock`'s; this module does the reads (the node,
and the lock's owner pod when a decision needs it) and the compare-and-swap writes (JSON
merge patch carrying the node's ``resourceVersion``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from hami.api import names
from hami.core.codec import encode_node_lock
from hami.kube import KubeError
from hami.scheduler.nodelock import (
    CONTENTION,
    LockAction,
    contention_message,
    lock_step,
    owner_awaits_allocate,
    owner_is_dangling,
    release_step,
    waiting_message,
)
from hami.scheduler.nodequeue import NodeWaiters

_CAS_ATTEMPTS = 5


class LockError(Exception):
    """The lock could not be taken (message as HAMi's, ending in ``node lock contention``
    for contention)."""

    @property
    def contention(self) -> bool:
        return str(self).endswith(CONTENTION)


class NodeApi(Protocol):
    async def get_node(self, name: str) -> dict[str, Any]: ...
    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...


def _lock_of(node: Mapping[str, Any], key: str = names.NODE_LOCK) -> tuple[str | None, str]:
    meta = node.get("metadata") or {}
    return (meta.get("annotations") or {}).get(key), str(meta.get("resourceVersion") or "")


class NodeLocks:
    """``acquire``/``release`` of a node lock annotation for pods: HAMi's generic
    ``hami.io/mutex.lock`` (``<RFC3339>,<ns>,<pod>``), or a vendor's own key (Cambricon
    ``cambricon.com/dsmlu.lock``, HAMi v2.10) whose value is the RFC3339 time alone
    (``owner_in_value=False``: no owner to check, so such a lock is only taken over
    once it is older than ``timeout``, and released only if it still holds the value
    this scheduler wrote).

    ``wait_change(node, seconds)`` is awaited between retries; the scheduler wires it to
    its node watch so a released lock is seen at once instead of after a poll. With
    ``waiters`` instead, binds wait in line (:class:`~hami.scheduler.nodequeue.NodeWaiters`:
    one node change wakes the longest waiter only).

    ``cached(node)`` is the node as the watch last showed it (read before any GET; a stale
    copy costs a 409 at most); the node a lock write of this object returned is used over
    it until the watch shows a newer version, so consecutive binds on one node do not
    write against a version they know is stale. ``owner_live(node, ns, name)`` is True
    when the scheduler's caches know the lock's owner as a live pod placed on that node:
    a contended lock is then contention without a GET of the owner (False: GET it).
    """

    def __init__(self, api: NodeApi, *, timeout: timedelta, retry_timeout: timedelta,
                 wait_change: Callable[[str, float], Any] | None = None,
                 cached: Callable[[str], Mapping[str, Any] | None] | None = None,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 annotation: str = names.NODE_LOCK, owner_in_value: bool = True,
                 owner_live: Callable[[str, str, str], bool] | None = None,
                 waiters: NodeWaiters | None = None) -> None:
        self.api = api
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.wait_change = wait_change
        self.cached = cached
        self.owner_live = owner_live
        self.waiters = waiters
        #: Per node: (resourceVersion written against, the node our write returned).
        self._wrote: dict[str, tuple[str, Mapping[str, Any]]] = {}
        self.now = now
        self.annotation = annotation
        self.owner_in_value = owner_in_value
        self._mutex: dict[str, asyncio.Lock] = {}
        #: Per node, the owner-less value this scheduler last wrote and for whom.
        self._written: dict[str, tuple[str, str, str]] = {}
        self.takeovers = 0

    async def acquire(self, node: str, namespace: str, name: str) -> None:
        """Take the lock for ``namespace/name``, retrying contention for the retry window.

        Raises:
            LockError: contention past the window, a malformed lock, or an API error.
        """
        await acquire_all([self], node, namespace, name)

    async def _try(self, node: str, namespace: str, name: str) -> None:
        mutex = self._mutex.setdefault(node, asyncio.Lock())
        async with mutex:
            for attempt in range(_CAS_ATTEMPTS):
                # First from the watch cache (saves a GET); a stale copy only costs a 409.
                obj = self._latest(node) if attempt == 0 else None
                if obj is None or not (obj.get("metadata") or {}).get("resourceVersion"):
                    obj = await self._get(node)
                value, rv = _lock_of(obj, self.annotation)
                now = self.now()
                step = lock_step(value, now, self.timeout, namespace, name)
                if step.action is LockAction.HELD:
                    return
                if step.action is LockAction.MALFORMED:
                    raise LockError(f"node {node}: {step.reason}")
                if step.action is LockAction.CONTENDED:
                    raise LockError(contention_message(node, self.timeout))
                if step.action is LockAction.CHECK_OWNER:
                    assert step.lock is not None
                    if self.owner_live is not None and self.owner_live(
                            node, step.lock.namespace, step.lock.name):
                        raise LockError(contention_message(node, self.timeout))
                    owner = await self._owner(step.lock.namespace, step.lock.name)
                    if not owner_is_dangling(owner):
                        raise LockError(contention_message(node, self.timeout))
                if step.action is LockAction.CHECK_WAITING:
                    assert step.lock is not None
                    owner = await self._owner(step.lock.namespace, step.lock.name)
                    if owner_awaits_allocate(owner, node):
                        raise LockError(waiting_message(node, step.lock, self.timeout))
                if step.action is not LockAction.SET:
                    self.takeovers += 1
                written = encode_node_lock(now, namespace, name)
                if not self.owner_in_value:
                    written = written.split(",", 1)[0]
                patch = {"metadata": {"annotations": {self.annotation: written},
                                      "resourceVersion": rv}}
                if await self._cas(node, patch):
                    if not self.owner_in_value:
                        self._written[node] = (namespace, name, written)
                    return
            raise LockError(contention_message(node, self.timeout))

    def seen(self, node: str, resource_version: str) -> None:
        """The watch delivered ``node`` at ``resource_version``: forget our write's copy
        unless that is still the version our write replaced."""
        wrote = self._wrote.get(node)
        if wrote is not None and wrote[0] != resource_version:
            del self._wrote[node]

    def locked_by_write(self) -> list[str]:
        """Nodes this object wrote a lock on that the watch has not shown yet."""
        return [node for node, (_, obj) in self._wrote.items()
                if _lock_of(obj, self.annotation)[0]]

    def _latest(self, node: str) -> Mapping[str, Any] | None:
        """The watch's copy of ``node``, or what our last lock write returned while the
        watch still shows the version that write replaced."""
        obj = self.cached(node) if self.cached is not None else None
        wrote = self._wrote.get(node)
        if wrote is not None:
            rv = str((obj or {}).get("metadata", {}).get("resourceVersion") or "")
            if obj is None or rv == wrote[0]:
                return wrote[1]
            del self._wrote[node]  # the watch moved past our write
        return obj

    async def release(self, node: str, namespace: str, name: str, *, force: bool = False) -> bool:
        """Remove the lock if it is exactly ``namespace/name``'s (or ``force``); returns
        whether something was removed. Never raises for a lock that is not ours (B01)."""
        mine = self._written.get(node)
        written = mine[2] if mine is not None and mine[:2] == (namespace, name) else None
        if written is not None:
            del self._written[node]
        for _ in range(_CAS_ATTEMPTS):
            try:
                obj = await self._get(node)
            except LockError:
                return False
            value, rv = _lock_of(obj, self.annotation)
            if self.owner_in_value:
                if not release_step(value, namespace, name, force=force):
                    return False
            elif not value or (value != written and not force):
                return False
            patch = {"metadata": {"annotations": {self.annotation: None},
                                  "resourceVersion": rv}}
            try:
                if await self._cas(node, patch):
                    return True
            except (LockError, KubeError):
                return False
        return False

    async def _get(self, node: str) -> dict[str, Any]:
        try:
            return await self.api.get_node(node)
        except KubeError as exc:
            raise LockError(f"failed to get node {node}: {exc.message}") from None

    async def _owner(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.api.get_pod(namespace, name)
        except KubeError as exc:
            raise LockError(f"failed to get lock owner {namespace}/{name}: {exc.message}") from None

    async def _cas(self, node: str, patch: Mapping[str, Any]) -> bool:
        """True when written, False on a resourceVersion conflict (re-read and retry)."""
        try:
            written = await self.api.patch_node(node, patch)
            rv = str(patch.get("metadata", {}).get("resourceVersion") or "")
            if rv and isinstance(written, Mapping) and written.get("metadata"):
                self._wrote[node] = (rv, written)
            return True
        except KubeError as exc:
            if exc.conflict:
                return False
            raise LockError(f"failed to patch node {node}: {exc.message}") from None


async def acquire_all(lock_sets: Sequence[NodeLocks], node: str, namespace: str,
                      name: str) -> list[NodeLocks]:
    """Take every lock in ``lock_sets`` for ``namespace/name`` (HAMi v2.10), retrying
    contention as a whole for the first set's retry window: after a contended attempt the
    locks already taken are released before waiting (then with a plain back-off: the
    release itself is a node change, so waking on node changes would spin), so a pod
    waiting for one vendor's lock holds none of the node's others meanwhile. Returns the
    locks taken.

    Raises:
        LockError: contention past the window, a malformed lock, or an API error; no lock
            of ``lock_sets`` is then held.
    """
    if not lock_sets:
        return []
    first = lock_sets[0]
    loop = asyncio.get_running_loop()
    window = first.retry_timeout.total_seconds()
    deadline = loop.time() + window
    delay = 0.05
    ticket = first.waiters.ticket() if first.waiters is not None else 0
    while True:
        held: list[NodeLocks] = []
        try:
            for locks in lock_sets:
                await locks._try(node, namespace, name)
                held.append(locks)
            return held
        except LockError as exc:
            for locks in reversed(held):
                await locks.release(node, namespace, name)
            if not exc.contention or loop.time() >= deadline:
                if exc.contention and window > 0:
                    raise LockError(f"timed out after {window:g}s waiting for node {node} "
                                    f"to be unlocked: {CONTENTION}") from None
                raise
        wait = min(delay, max(0.0, deadline - loop.time()))
        if first.waiters is not None and not held:
            await first.waiters.wait(node, wait, ticket)
        elif first.wait_change is not None and not held:
            await first.wait_change(node, wait)
        else:  # our own release just changed the node: a watch wake-up would spin
            await asyncio.sleep(wait)
        delay = min(delay * 2, 0.5)
