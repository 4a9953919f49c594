"""What a burst of binds costs in API calls, and where the filter sends it: the bind-phase
on the filter's patch, the node lock read from the caches, busy nodes avoided (a real
aiohttp server and engine, the in-memory API stand-in of tests/integration/fake_kube.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from hami.core.codec import encode_node_lock
from hami.scheduler.binder import LockError, NodeLocks
from hami.scheduler.nodequeue import InFlight, NodeWaiters

from .fake_kube import FakeKube
from .support import gpu_pod, node, run, serving

LOCK = "hami.io/mutex.lock"


def cluster(*names: str) -> FakeKube:
    kube = FakeKube()
    for name in names:
        kube.put("Node", node(name))
    return kube


async def allocate(kube: FakeKube, pod: str, node_name: str) -> None:
    """The device plugin's Allocate as the API sees it: bind-phase success, lock released."""
    await kube.patch_pod("default", pod, {"metadata": {"annotations": {
        "hami.io/bind-phase": "success"}}})
    await kube.patch_node(node_name, {"metadata": {"annotations": {LOCK: None}}})


async def spin() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_bind_after_the_filter_is_one_lock_write_and_the_binding() -> None:
    async def scenario() -> None:
        kube = cluster("n1")
        async with serving(kube) as h:
            pod = kube.put("Pod", gpu_pod("a", memory_mib=1000))
            assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            await h.settle()
            ann = kube.pod("a")["metadata"]["annotations"]
            # the filter's one patch carries what HAMi's bind writes in a second one
            assert ann["hami.io/bind-phase"] == "allocating"
            assert ann["hami.io/bind-time"].isdigit()
            assert ann["hami.io/vgpu-devices-to-allocate"]
            before = len(kube.calls)
            assert (await h.bind(pod, "n1"))["Error"] == ""
            assert kube.calls[before:] == ["patch node", "bind"]
            assert kube.pod("a")["spec"]["nodeName"] == "n1"
            assert kube.node("n1")["metadata"]["annotations"][LOCK].endswith(",default,a")

    run(scenario)


def test_bind_of_a_pod_filtered_before_a_restart_still_writes_the_bind_phase() -> None:
    async def scenario() -> None:
        kube = cluster("n1")
        async with serving(kube) as h:  # the earlier process: filter only
            pod = kube.put("Pod", gpu_pod("a", memory_mib=1000))
            assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            await h.settle()
        # what an older scheduler's filter wrote: no bind-phase, no bind-time
        kube.put("Pod", {**kube.pod("a"), "metadata": {
            **kube.pod("a")["metadata"],
            "annotations": {k: v for k, v in kube.pod("a")["metadata"]["annotations"].items()
                            if k not in ("hami.io/bind-phase", "hami.io/bind-time")}}})
        async with serving(kube) as h:
            before = len(kube.calls)
            assert (await h.bind(kube.pod("a"), "n1"))["Error"] == ""
            assert kube.calls[before:] == ["patch node", "patch pod", "bind"]
            assert kube.pod("a")["metadata"]["annotations"]["hami.io/bind-phase"] == "allocating"

    run(scenario)


def test_a_lock_held_by_a_charged_pod_is_waited_for_without_reading_the_owner() -> None:
    async def scenario() -> None:
        kube = cluster("n1")
        async with serving(kube, node_lock_retry_timeout=timedelta(seconds=0.3)) as h:
            a = kube.put("Pod", gpu_pod("a", memory_mib=1000))
            b = kube.put("Pod", gpu_pod("b", memory_mib=1000))
            for pod in (a, b):
                assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            assert (await h.bind(a, "n1"))["Error"] == ""
            await h.settle()
            before = len(kube.calls)
            reply = await h.bind(b, "n1")
            assert "node lock contention" in reply["Error"]
            assert "get pod" not in kube.calls[before:]  # a is in the ledger on n1
            assert "get node" not in kube.calls[before:]

    run(scenario)


def test_a_lock_written_here_is_not_overwritten_against_a_stale_cached_node() -> None:
    async def scenario() -> None:
        kube = cluster("n1")
        kube.put("Pod", gpu_pod("a", memory_mib=1000))
        stale = kube.node("n1")  # the watch has not delivered anything newer
        locks = NodeLocks(kube, timeout=timedelta(minutes=5), retry_timeout=timedelta(0),
                          cached=lambda name: stale)
        await locks.acquire("n1", "default", "a")
        with pytest.raises(LockError, match="node lock contention"):
            await locks.acquire("n1", "default", "b")
        # one lock write (a's); b saw a's lock in what that write returned: no 409 and no
        # GET of the node, only of the owner (no owner_live here)
        assert kube.calls == ["patch node", "get pod"]

    run(scenario)


def test_a_burst_is_placed_on_nodes_without_a_bind_in_flight() -> None:
    async def scenario() -> None:
        kube = cluster("n1", "n2", "n3")
        async with serving(kube, node_scheduler_policy="binpack") as h:
            pods = [kube.put("Pod", gpu_pod(f"p{i}", memory_mib=1000)) for i in range(4)]
            placed = [(await h.filter(p, ["n1", "n2", "n3"]))["NodeNames"][0] for p in pods[:3]]
            # binpack alone would stack all three on n1 behind its lock
            assert sorted(placed) == ["n1", "n2", "n3"]
            first = placed[0]
            assert (await h.bind(pods[0], first))["Error"] == ""
            await allocate(kube, "p0", first)
            await h.settle()
            # the first node's bind is done: binpack packs onto it again (the fullest)
            assert (await h.filter(pods[3], ["n1", "n2", "n3"]))["NodeNames"] == [first]

    run(scenario)


def test_a_burst_larger_than_the_nodes_is_spread_evenly_over_their_queues() -> None:
    async def scenario() -> None:
        kube = cluster("n1", "n2", "n3")
        async with serving(kube, node_scheduler_policy="binpack") as h:
            pods = [kube.put("Pod", gpu_pod(f"p{i}", memory_mib=1000)) for i in range(7)]
            placed = [(await h.filter(p, ["n1", "n2", "n3"]))["NodeNames"][0] for p in pods]
            # every node takes a second pod before any takes a third
            assert placed == ["n1", "n2", "n3", "n1", "n2", "n3", "n1"]
            assert h.engine.busy_nodes() == {"n1": 3, "n2": 2, "n3": 2}

    run(scenario)


def test_a_busy_node_is_still_chosen_when_no_other_fits() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        kube.put("Node", node("n1"))
        kube.put("Node", node("n2", gpus=1))
        async with serving(kube, node_scheduler_policy="binpack") as h:
            a = kube.put("Pod", gpu_pod("a", memory_mib=1000))
            two = kube.put("Pod", gpu_pod("two", gpus=2, memory_mib=1000))
            assert (await h.filter(a, ["n1", "n2"]))["NodeNames"] == ["n1"]
            assert h.engine.busy_nodes() == {"n1": 1}
            # only n1 has two GPUs: the busy node rather than no node
            assert (await h.filter(two, ["n1", "n2"]))["NodeNames"] == ["n1"]

    run(scenario)


def test_busy_nodes_are_not_avoided_when_switched_off() -> None:
    async def scenario() -> None:
        kube = cluster("n1", "n2")
        async with serving(kube, node_scheduler_policy="binpack", avoid_busy_nodes=False) as h:
            pods = [kube.put("Pod", gpu_pod(f"p{i}", memory_mib=1000)) for i in range(2)]
            placed = [(await h.filter(p, ["n1", "n2"]))["NodeNames"][0] for p in pods]
            assert placed == ["n1", "n1"]

    run(scenario)


def test_a_node_locked_by_someone_else_is_busy() -> None:
    async def scenario() -> None:
        kube = cluster("n1", "n2")
        lock = encode_node_lock(datetime.now(UTC), "other", "pod")
        await kube.patch_node("n1", {"metadata": {"annotations": {LOCK: lock}}})
        async with serving(kube, node_scheduler_policy="binpack") as h:
            assert h.engine.busy_nodes() == {"n1": 1}
            pod = kube.put("Pod", gpu_pod("a", memory_mib=1000))
            assert (await h.filter(pod, ["n1", "n2"]))["NodeNames"] == ["n2"]

    run(scenario)


def test_one_node_change_wakes_the_longest_waiter_only() -> None:
    async def scenario() -> None:
        waiters = NodeWaiters()
        woken: list[str] = []

        async def wait(name: str, ticket: int) -> None:
            await waiters.wait("n1", 5.0, ticket)
            woken.append(name)

        tickets = {name: waiters.ticket() for name in ("first", "second", "third")}
        tasks = [asyncio.create_task(wait(n, t)) for n, t in reversed(tickets.items())]
        await spin()
        assert waiters.waiting("n1") == 3
        waiters.changed("n1")
        await spin()
        assert woken == ["first"] and waiters.waiting("n1") == 2
        waiters.changed("n1")
        await spin()
        assert woken == ["first", "second"]
        waiters.changed("n2")  # another node: nobody here
        await spin()
        assert woken == ["first", "second"]
        waiters.changed("n1")
        await asyncio.gather(*tasks)
        assert woken == ["first", "second", "third"]

    run(scenario)


def test_in_flight_entries_end_with_the_bind_or_their_time() -> None:
    now = [0.0]
    inflight = InFlight(ttl_s=10.0, clock=lambda: now[0])
    inflight.add("u1", "n1")
    inflight.add("u2", "n1")
    inflight.add("u3", "n2")
    inflight.add("u3", "n3")  # placed again elsewhere
    assert inflight.counts() == {"n1": 2, "n3": 1}
    inflight.done("u1")
    assert inflight.counts() == {"n1": 1, "n3": 1}
    inflight.done("u2")
    assert inflight.counts() == {"n3": 1}
    now[0] = 11.0
    assert inflight.counts() == {} and len(inflight) == 0
