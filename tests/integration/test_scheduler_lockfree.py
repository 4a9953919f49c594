"""``/bind`` on nodes whose hami device plugin runs allocate mode ``cdi``
(``hami.io/node-allocate-mode: cdi``): no node lock, several binds on one node at once;
every other node keeps HAMi's lock. Real aiohttp server, in-memory API."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from hami.api import names

from .fake_kube import FakeKube
from .support import gpu_pod, node, run, serving


def cluster(**modes: str | None) -> FakeKube:
    """Nodes by name, each with the allocate-mode annotation given (None: none)."""
    kube = FakeKube()
    for name, mode in modes.items():
        n = node(name)
        if mode is not None:
            n["metadata"]["annotations"][names.NODE_ALLOCATE_MODE] = mode
        kube.put("Node", n)
    return kube


def lock_of(kube: FakeKube, name: str) -> str | None:
    return kube.node(name)["metadata"]["annotations"].get(names.NODE_LOCK)


def test_a_node_in_cdi_mode_binds_a_burst_without_the_node_lock() -> None:
    async def scenario() -> None:
        kube = cluster(n1="cdi")
        async with serving(kube, node_lock_retry_timeout=timedelta(seconds=1)) as h:
            pods = [kube.put("Pod", gpu_pod(f"p{i}", memory_mib=1000)) for i in range(6)]
            for pod in pods:
                assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            # Nobody releases a lock here: with HAMi's protocol the second bind would wait
            # for the first pod's Allocate and fail with contention.
            results = await asyncio.gather(*(h.bind(p, "n1") for p in pods))
            assert [r["Error"] for r in results] == [""] * 6
            assert lock_of(kube, "n1") is None
            for pod in pods:
                bound = kube.pod(pod["metadata"]["name"])
                assert bound["spec"]["nodeName"] == "n1"
                assert bound["metadata"]["annotations"][names.BIND_PHASE] == "allocating"
            assert h.engine.busy_nodes() == {}

    run(scenario)


@pytest.mark.parametrize("forged", ["CDI", "cdi ", "node-lock", "", "cdi,node-lock"])
def test_any_other_value_keeps_the_lock(forged: str) -> None:
    """The annotation is the node's own claim, taken exactly; anything else is HAMi's
    protocol (the lock is written and the next bind waits for it)."""
    async def scenario() -> None:
        kube = cluster(n1=forged)
        async with serving(kube, node_lock_retry_timeout=timedelta(seconds=0.5)) as h:
            a, b = (kube.put("Pod", gpu_pod(n, memory_mib=1000)) for n in ("a", "b"))
            for pod in (a, b):
                await h.filter(pod, ["n1"])
            assert (await h.bind(a, "n1"))["Error"] == ""
            assert (lock_of(kube, "n1") or "").endswith(",default,a")
            assert (await h.bind(b, "n1"))["Error"].endswith("node lock contention")

    run(scenario)


def test_a_node_claims_only_for_itself() -> None:
    """n2 advertising the mode spares n2's binds the lock, not n1's."""
    async def scenario() -> None:
        kube = cluster(n1=None, n2="cdi")
        async with serving(kube, node_lock_retry_timeout=timedelta(seconds=0.5)) as h:
            a = kube.put("Pod", gpu_pod("a", memory_mib=1000))
            b = kube.put("Pod", gpu_pod("b", memory_mib=1000))
            assert (await h.filter(a, ["n1"]))["NodeNames"] == ["n1"]
            assert (await h.filter(b, ["n2"]))["NodeNames"] == ["n2"]
            assert (await h.bind(a, "n1"))["Error"] == ""
            assert (await h.bind(b, "n2"))["Error"] == ""
            assert (lock_of(kube, "n1") or "").endswith(",default,a")
            assert lock_of(kube, "n2") is None
            assert h.engine.busy_nodes() == {"n1": 1}

    run(scenario)


def test_a_node_going_back_to_the_lock_is_locked_again() -> None:
    """The plugin removes the annotation when it runs HAMi's protocol again; the watch
    brings the change and binds lock again."""
    async def scenario() -> None:
        kube = cluster(n1="cdi")
        async with serving(kube) as h:
            a, b = (kube.put("Pod", gpu_pod(n, memory_mib=1000)) for n in ("a", "b"))
            await h.filter(a, ["n1"])
            assert (await h.bind(a, "n1"))["Error"] == ""
            assert lock_of(kube, "n1") is None
            await kube.patch_node("n1", {"metadata": {"annotations": {
                names.NODE_ALLOCATE_MODE: None}}})
            for _ in range(100):
                if not h.engine.lock_free("n1"):
                    break
                await asyncio.sleep(0.02)
            await h.filter(b, ["n1"])
            assert (await h.bind(b, "n1"))["Error"] == ""
            assert (lock_of(kube, "n1") or "").endswith(",default,b")

    run(scenario)
