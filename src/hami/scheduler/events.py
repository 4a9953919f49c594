"""Kubernetes Events on pods (HAMi v2.10 reasons, and ours below), sent in the background.

Events are best effort (HAMi logs and goes on when one fails): they are queued and a
worker posts them, so a slow apiserver never adds to filter or bind latency. When the
queue is full new events are dropped and counted.

Under load the queue aggregates the routine pair: a ``FilteringSucceed`` or
``BindingSucceed`` about a pod whose earlier one is still queued joins that event (the
later reason, both messages, ``count`` 2) instead of becoming a second write, so a burst
costs the API server one hami event per pod (``FilteringSucceed`` + ``BindingSucceed`` as
one ``BindingSucceed``) while a quiet scheduler posts both as HAMi does. Any other reason
(``Preempting``, ``Preempted``, ...) and every Warning is posted on its own: its reason is
what users and tools look for, and a merge would overwrite it with the later one.

A pod that stays Pending is filtered again and again with the same outcome; an event
identical to one posted for the same pod (reason, type and message) less than
:data:`REPEAT_WINDOW_S` ago is not posted again (counted in ``repeated``), so ``kubectl
describe`` lists it once instead of one line per retry (issue 28). kube-scheduler's own
``FailedScheduling`` event keeps counting the retries.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

log = logging.getLogger("hami.scheduler.events")

FILTERING_FAILED = "FilteringFailed"
FILTERING_SUCCEED = "FilteringSucceed"
BINDING_FAILED = "BindingFailed"
BINDING_SUCCEED = "BindingSucceed"
#: Ours (Warning): a pod's ``hami.io/gpu-scheduler-policy`` or
#: ``hami.io/node-scheduler-policy`` value is unknown (the webhook was bypassed), so the
#: filter used the configured policy; one event per annotation and filter.
UNKNOWN_SCHEDULER_POLICY = "UnknownSchedulerPolicy"


#: The Normal reasons that merge while queued (see the module docstring).
MERGEABLE = frozenset({FILTERING_SUCCEED, BINDING_SUCCEED})

#: An event identical to one posted for the same pod within this many seconds is dropped.
REPEAT_WINDOW_S = 600.0
#: Posted events remembered for that (oldest forgotten first).
REPEAT_MEMORY = 4096


class EventWriter(Protocol):
    async def create_event(self, event: Mapping[str, Any]) -> None: ...


def pod_event(pod_meta: Mapping[str, Any], reason: str, message: str, *, warning: bool,
              component: str, now: datetime | None = None,
              name: str | None = None) -> dict[str, Any]:
    """A core/v1 Event about a pod (``pod_meta``: namespace, name, uid); ``name``: the
    Event's name (default ``<pod>.<random>``; a fixed one makes a second post of the
    same Event, by any replica or after a restart, fail with 409 instead of repeating
    it)."""
    event_name = name
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    namespace = str(pod_meta.get("namespace") or "default")
    name = str(pod_meta.get("name") or "")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name or f"{name[:200]}.{secrets.token_hex(8)}",
                     "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace,
                           "name": name, "uid": str(pod_meta.get("uid") or "")},
        "reason": reason, "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component}, "reportingComponent": component,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


class EventSink:
    """A bounded queue of events and one worker task that posts them."""

    def __init__(self, writer: EventWriter, component: str, *, enabled: bool = True,
                 max_queued: int = 2000) -> None:
        self.writer = writer
        self.component = component
        self.enabled = enabled
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(max_queued)
        self.dropped = 0
        self.sent = 0
        #: Normal events that joined a queued one instead of being posted.
        self.merged = 0
        #: The queued Normal event per pod (namespace, name, uid), while it waits.
        self._queued: dict[tuple[str, str, str], dict[str, Any]] = {}
        #: Identical repeats not posted (see the module docstring).
        self.repeated = 0
        #: (namespace, name, uid, reason, type, message) -> monotonic time it was queued.
        self._recent: OrderedDict[tuple[str, ...], float] = OrderedDict()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="events")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def emit(self, pod_meta: Mapping[str, Any], reason: str, message: str, *,
             warning: bool, name: str | None = None) -> None:
        if not self.enabled:
            return
        event = pod_event(pod_meta, reason, message, warning=warning, component=self.component,
                          name=name)
        obj = event["involvedObject"]
        key = (obj["namespace"], obj["name"], obj["uid"])
        if self._repeat(key + (reason, event["type"], event["message"])):
            self.repeated += 1
            return
        mergeable = not warning and reason in MERGEABLE
        queued = self._queued.get(key) if mergeable else None
        if queued is not None:
            queued["reason"] = reason
            queued["message"] = f"{queued['message']}; {event['message']}"[:1024]
            queued["lastTimestamp"] = event["lastTimestamp"]
            queued["count"] += 1
            self.merged += 1
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            return
        if mergeable:
            self._queued[key] = event

    def _repeat(self, ident: tuple[str, ...]) -> bool:
        """True when ``ident`` was seen within :data:`REPEAT_WINDOW_S`; else remember it."""
        now = time.monotonic()
        seen = self._recent.get(ident)
        if seen is not None and now - seen < REPEAT_WINDOW_S:
            return True
        self._recent[ident] = now
        self._recent.move_to_end(ident)
        while len(self._recent) > REPEAT_MEMORY:
            self._recent.popitem(last=False)
        return False

    async def _run(self) -> None:
        while True:
            event = await self.queue.get()
            obj = event["involvedObject"]
            key = (obj["namespace"], obj["name"], obj["uid"])
            if self._queued.get(key) is event:
                del self._queued[key]
            try:
                await self.writer.create_event(event)
                self.sent += 1
            except Exception as exc:  # best effort, as HAMi
                log.debug("event %s not posted: %s", event["reason"], exc)
