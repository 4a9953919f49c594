"""The event queue aggregates a pod's Normal events while they wait (a burst costs one
event write per pod), and posts them one by one when it keeps up."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from hami.scheduler.events import BINDING_SUCCEED, FILTERING_FAILED, FILTERING_SUCCEED, EventSink


class Recorder:
    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []

    async def create_event(self, event: Mapping[str, Any]) -> None:
        self.posted.append(dict(event))


def pod(name: str) -> dict[str, str]:
    return {"namespace": "default", "name": name, "uid": f"uid-{name}"}


async def drain(sink: EventSink) -> None:
    for _ in range(50):
        if sink.queue.empty():
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0)


def test_a_pods_queued_normal_events_are_posted_as_one() -> None:
    async def scenario() -> None:
        writer = Recorder()
        sink = EventSink(writer, "hami-scheduler")
        # the worker is behind (not started): both wait in the queue
        sink.emit(pod("a"), FILTERING_SUCCEED, "find fit node(n1)", warning=False)
        sink.emit(pod("b"), FILTERING_SUCCEED, "find fit node(n2)", warning=False)
        sink.emit(pod("a"), BINDING_SUCCEED, "Successfully binding node [n1]", warning=False)
        sink.emit(pod("a"), FILTERING_FAILED, "patch failed", warning=True)
        assert sink.queue.qsize() == 3 and sink.merged == 1
        sink.start()
        await drain(sink)
        await sink.stop()
        got = [(e["involvedObject"]["name"], e["reason"], e["message"], e["count"])
               for e in writer.posted]
        assert got == [
            ("a", BINDING_SUCCEED, "find fit node(n1); Successfully binding node [n1]", 2),
            ("b", FILTERING_SUCCEED, "find fit node(n2)", 1),
            ("a", FILTERING_FAILED, "patch failed", 1)]

    asyncio.run(scenario())


def test_a_queued_preempting_event_keeps_its_reason() -> None:
    """A preemptor's ``Preempting`` (what the e2e test and users look for) queued behind a
    slow API server must not become the ``BindingSucceed`` that follows it, nor absorb
    the ``FilteringSucceed`` before it: each is posted with its own reason."""
    from hami.scheduler.evictions import PREEMPTED, PREEMPTING

    async def scenario() -> None:
        writer = Recorder()
        sink = EventSink(writer, "hami-scheduler")
        sink.emit(pod("hi"), FILTERING_SUCCEED, "find fit node(n1)", warning=False)
        sink.emit(pod("lo"), PREEMPTED, "preempted by default/hi", warning=False)
        sink.emit(pod("hi"), PREEMPTING, "evicts default/lo on n1", warning=False)
        sink.emit(pod("hi"), BINDING_SUCCEED, "Successfully binding node [n1]", warning=False)
        sink.emit(pod("lo"), BINDING_SUCCEED, "Successfully binding node [n2]", warning=False)
        sink.start()
        await drain(sink)
        await sink.stop()
        got = [(e["involvedObject"]["name"], e["reason"]) for e in writer.posted]
        assert got == [("hi", BINDING_SUCCEED), ("lo", PREEMPTED), ("hi", PREEMPTING),
                       ("lo", BINDING_SUCCEED)], got
        assert sink.merged == 1  # only the routine pair of pod hi

    asyncio.run(scenario())


def test_an_event_already_taken_by_the_worker_is_not_joined() -> None:
    async def scenario() -> None:
        writer = Recorder()
        sink = EventSink(writer, "hami-scheduler")
        sink.start()
        sink.emit(pod("a"), FILTERING_SUCCEED, "find fit node(n1)", warning=False)
        await drain(sink)
        sink.emit(pod("a"), BINDING_SUCCEED, "Successfully binding node [n1]", warning=False)
        await drain(sink)
        await sink.stop()
        assert [e["reason"] for e in writer.posted] == [FILTERING_SUCCEED, BINDING_SUCCEED]
        assert sink.merged == 0

    asyncio.run(scenario())


def test_a_pending_pods_identical_failures_are_posted_once() -> None:
    """Issue 28: a Pending pod filtered on every retry got one identical FilteringFailed
    event per retry, each a line of its own in `kubectl describe`."""
    import hami.scheduler.events as events

    async def scenario() -> None:
        writer = Recorder()
        sink = EventSink(writer, "hami-scheduler")
        sink.start()
        for _ in range(5):
            sink.emit(pod("a"), FILTERING_FAILED, "no available node, 1 nodes do not meet",
                      warning=True)
        sink.emit(pod("a"), FILTERING_FAILED, "no available node, 2 nodes do not meet",
                  warning=True)  # new information: posted
        sink.emit(pod("b"), FILTERING_FAILED, "no available node, 1 nodes do not meet",
                  warning=True)  # another pod: posted
        await drain(sink)
        assert [(e["involvedObject"]["name"], e["message"]) for e in writer.posted] == [
            ("a", "no available node, 1 nodes do not meet"),
            ("a", "no available node, 2 nodes do not meet"),
            ("b", "no available node, 1 nodes do not meet")]
        assert sink.repeated == 4
        # after the window the same failure is posted again (still failing)
        real = events.REPEAT_WINDOW_S
        events.REPEAT_WINDOW_S = 0.0
        try:
            sink.emit(pod("a"), FILTERING_FAILED, "no available node, 1 nodes do not meet",
                      warning=True)
        finally:
            events.REPEAT_WINDOW_S = real
        await drain(sink)
        await sink.stop()
        assert len(writer.posted) == 4

    asyncio.run(scenario())
