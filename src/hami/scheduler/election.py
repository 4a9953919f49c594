"""Leader election loop on a Lease (decisions in :mod:`hami.scheduler.lease`).

Only the leader answers ``/filter`` and ``/bind`` and writes node handshakes; a follower
keeps its caches warm from the same watches and, on winning the lease, relists before it
decides anything. A leader that cannot renew within the renew deadline steps down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from hami.kube import KubeError
from hami.scheduler.lease import follows_as_leader, lease_step, release_spec
from hami.scheduler.settings import SchedulerSettings

log = logging.getLogger("hami.scheduler.election")


class LeaseApi(Protocol):
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def create_lease(self, namespace: str, name: str,
                           spec: Mapping[str, Any]) -> dict[str, Any]: ...
    async def replace_lease(self, namespace: str, name: str, spec: Mapping[str, Any],
                            resource_version: str) -> dict[str, Any]: ...


class LeaderElector:
    """Acquire and renew the Lease; call ``on_change(True/False)`` on transitions.
    ``now``: the wall clock the Lease's times are read and written with (UTC)."""

    def __init__(self, api: LeaseApi, settings: SchedulerSettings,
                 on_change: Callable[[bool], Awaitable[None]], *,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.api = api
        self.now = now
        self.namespace = settings.leader_elect_resource_namespace
        self.name = settings.leader_elect_resource_name
        self.identity = settings.identity
        self.duration = settings.leader_elect_lease_duration
        self.renew_deadline = settings.leader_elect_renew_deadline.total_seconds()
        self.retry = settings.leader_elect_retry_period.total_seconds()
        self.on_change = on_change
        self.follow = settings.leader_elect_follow
        self.hostname = settings.identity.split("_", 1)[0]
        self.leader = False
        self.holder = ""
        self._renewed = 0.0

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # never let the loop die: a dead loop would lead forever
                log.exception("leader election round failed")
                if self.leader and time.monotonic() - self._renewed > self.renew_deadline:
                    await self._set(False)
            await asyncio.sleep(self.retry)

    async def tick(self) -> None:
        """One read-decide-write round (read-decide only when following kube-scheduler)."""
        try:
            lease = await self.api.get_lease(self.namespace, self.name)
            if self.follow:
                spec = None if lease is None else (lease.get("spec") or {})
                self.holder = "" if spec is None else str(spec.get("holderIdentity") or "")
                await self._set(follows_as_leader(spec, self.hostname, self.now()))
                return
            spec = None if lease is None else (lease.get("spec") or {})
            step = lease_step(spec, self.identity, self.now(), self.duration)
            self.holder = step.holder
            if step.spec is None:
                await self._set(False)
                return
            if lease is None:
                await self.api.create_lease(self.namespace, self.name, step.spec)
            else:
                rv = str((lease.get("metadata") or {}).get("resourceVersion") or "")
                await self.api.replace_lease(self.namespace, self.name, step.spec, rv)
            self._renewed = time.monotonic()
            await self._set(True)
        except KubeError as exc:
            log.info("lease %s/%s: %s", self.namespace, self.name, exc)
            if self.leader and time.monotonic() - self._renewed > self.renew_deadline:
                await self._set(False)

    async def _set(self, leader: bool) -> None:
        if leader != self.leader:
            log.info("%s leadership of %s/%s", "acquired" if leader else "lost",
                        self.namespace, self.name)
            self.leader = leader
            try:
                await self.on_change(leader)
            except Exception as exc:  # e.g. the relist failed: try again next round
                log.warning("leadership change not applied: %s", exc)
                self.leader = False

    async def release(self) -> None:
        """Clean shutdown: free the lease so a standby takes over at once."""
        if not self.leader or self.follow:
            return
        try:
            lease = await self.api.get_lease(self.namespace, self.name)
            if lease is None:
                return
            spec = release_spec(lease.get("spec") or {}, self.identity, self.now())
            if spec is not None:
                rv = str((lease.get("metadata") or {}).get("resourceVersion") or "")
                await self.api.replace_lease(self.namespace, self.name, spec, rv)
        except KubeError as exc:
            log.info("lease release: %s", exc)
