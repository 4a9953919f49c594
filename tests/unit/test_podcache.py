"""Which pods ``/filter`` may place (:class:`hami.scheduler.podcache.PendingPods`)."""

from __future__ import annotations

import asyncio

import pytest

from hami.scheduler.podcache import PendingPods, UnknownPod


def pod(name: str = "p", uid: str = "u1", **spec: object) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"schedulerName": "hami-scheduler", **spec}, "status": {"phase": "Pending"}}


def test_only_unbound_live_pods_of_our_scheduler_are_kept() -> None:
    cache = PendingPods("hami-scheduler")
    cache.apply(pod(uid="a"), deleted=False)
    cache.apply(pod(uid="b", nodeName="n1"), deleted=False)
    cache.apply(pod(uid="c", schedulerName="other"), deleted=False)
    finished = pod(uid="d")
    finished["status"]["phase"] = "Failed"
    cache.apply(finished, deleted=False)
    going = pod(uid="e")
    going["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    cache.apply(going, deleted=False)
    assert len(cache) == 1
    cache.apply(pod(uid="a", nodeName="n1"), deleted=False)  # bound: gone
    assert len(cache) == 0
    cache.apply(pod(uid="f"), deleted=False)
    cache.forget_unlisted(["g"])
    assert len(cache) == 0


def test_resolve_uses_the_cache_then_the_api_and_checks_the_uid() -> None:
    cache = PendingPods("hami-scheduler")
    cached = pod(uid="a")
    cache.apply(cached, deleted=False)
    reads: list[tuple[str, str]] = []

    async def get_pod(namespace: str, name: str) -> dict | None:
        reads.append((namespace, name))
        return {"p": pod(uid="a"), "q": pod("q", uid="q1", nodeName="n1")}.get(name)

    body = pod(uid="a", containers=[{"name": "forged"}])
    assert asyncio.run(cache.resolve(body, get_pod)) == cached and reads == []
    with pytest.raises(UnknownPod, match="does not exist"):
        asyncio.run(cache.resolve(pod("x", uid="x1"), get_pod))
    with pytest.raises(UnknownPod, match="does not exist"):
        asyncio.run(cache.resolve(pod(uid="other"), get_pod))  # same name, other UID
    with pytest.raises(UnknownPod, match="not waiting"):
        asyncio.run(cache.resolve(pod("q", uid="q1"), get_pod))
    # cached UID but the body names another pod: read from the API, which disagrees
    with pytest.raises(UnknownPod, match="does not exist"):
        asyncio.run(cache.resolve(pod("x", uid="a"), get_pod))


def test_filtered_marks_expire() -> None:
    now = [0.0]
    cache = PendingPods("hami-scheduler", filtered_ttl_s=10, clock=lambda: now[0])
    cache.filtered("a")
    assert cache.was_filtered("a") and not cache.was_filtered("b")
    now[0] = 11
    assert not cache.was_filtered("a")
    cache.filtered("c")
    cache.bound("c")
    assert not cache.was_filtered("c")
