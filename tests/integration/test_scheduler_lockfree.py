"""``/bind`` on nodes whose hami device plugin runs allocate mode ``cdi``
(``hami.io/node-allocate-mode: cdi``): no node lock, several binds on one node at once;
every other node keeps HAMi's lock. Real aiohttp server, in-memory API."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from hami.api import names
from hami.core.provenance import check_to_allocate, verify
from hami.deviceplugin.allocate import ContainerView, PodView
from hami.deviceplugin.cdimode import check_pod_here, completion_patch
from hami.kube import KubeError

from .fake_kube import FakeKube
from .support import gpu_pod, node, run, serving
from .test_scheduler_vendors import DCU, DEVICE_CONFIG, NV, mixed_node
from .test_scheduler_vendors import pod as vendor_pod


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
                assert bound["metadata"]["annotations"][names.BIND_PHASE] == "success"
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


def used_mib(h: Any, node_name: str) -> int:
    """Device memory the ledger charges on ``node_name`` (MiB)."""
    return sum(used for _, _, used, _ in h.engine.state.ledger.device_usage(node_name))


@pytest.mark.parametrize("async_patch", [True, False])
def test_a_cdi_bind_writes_the_allocation_with_the_binding_and_no_pod_patch(
        tmp_path: Path, async_patch: bool) -> None:
    """Issue 15: on a node in mode ``cdi`` the filter writes nothing; the Binding carries
    the allocation, the signature, the label and what the device plugin's success patch
    wrote (``bind-phase=success``, the to-allocate string emptied): the allocation is
    final when it lands, so the plugin has nothing to write (two pod writes fewer per
    pod). The device plugin's checks hold on what it wrote, and the pod watch then brings
    the bound pod: charged once."""
    (tmp_path / "current").write_text("k" * 64)

    async def scenario() -> None:
        kube = cluster(n1="cdi")
        async with serving(kube, allocation_key_dir=str(tmp_path),
                           async_annotation_patch=async_patch) as h:
            pod = kube.put("Pod", gpu_pod("a", memory_mib=1000))
            kube.calls.clear()
            assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            await h.settle()
            assert kube.calls == [], "the filter wrote to the API"
            assert used_mib(h, "n1") == 1000  # charged in memory until the bind
            assert names.VGPU_NODE not in kube.pod("a")["metadata"]["annotations"]
            assert (await h.bind(pod, "n1"))["Error"] == ""
            assert kube.calls == ["bind"]
            bound = kube.pod("a")
            ann, labels = bound["metadata"]["annotations"], bound["metadata"]["labels"]
            assert bound["spec"]["nodeName"] == "n1"
            assert ann[names.VGPU_NODE] == "n1" and labels[names.VGPU_NODE] == "n1"
            assert ann[names.BIND_PHASE] == "success" and ann[names.BIND_TIME]
            assert ann[names.DEVICES_TO_ALLOCATE] == ";" and ann[names.DEVICES_ALLOCATED] != ";"
            verify([b"k" * 64], pod["metadata"]["uid"], "n1", ann)
            check_to_allocate(ann)
            view = PodView("default", "a", pod["metadata"]["uid"], "n1", "Pending", ann,
                           (ContainerView("main"),), labels=labels)
            check_pod_here(view, "n1")
            assert completion_patch(view) is None  # the plugin writes nothing on success
            await h.settle()
            assert used_mib(h, "n1") == 1000  # the watch's bound pod: the same charge
            assert [e.uid for e in h.engine.state.ledger.pods()] == [pod["metadata"]["uid"]]
            # a restart rebuilds the ledger from the pod: the same charge again
            async with serving(kube) as h2:
                assert used_mib(h2, "n1") == 1000

    run(scenario)


def test_before_1_33_the_label_lost_with_the_binding_is_patched() -> None:
    """An API server before 1.33 drops a Binding's labels: the scheduler (told so at
    start-up, :mod:`hami.clusterprobe`) writes hami.io/vgpu-node with a patch after the
    Binding; on 1.33+ it writes nothing more."""
    async def scenario() -> None:
        for copies in (False, True):
            kube = cluster(n1="cdi")
            kube.binding_labels = copies
            async with serving(kube) as h:
                h.engine.binding_copies_labels = copies
                pod = kube.put("Pod", gpu_pod("a", memory_mib=1000))
                assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
                await h.settle()
                kube.calls.clear()
                assert (await h.bind(pod, "n1"))["Error"] == ""
                assert kube.calls == (["bind"] if copies else ["bind", "patch pod"])
                bound = kube.pod("a")
                assert bound["metadata"]["labels"][names.VGPU_NODE] == "n1"
                assert bound["metadata"]["annotations"][names.BIND_PHASE] == "success"

    run(scenario)


def test_a_failed_label_patch_after_the_binding_still_binds() -> None:
    async def scenario() -> None:
        kube = cluster(n1="cdi")
        kube.binding_labels = False
        async with serving(kube) as h:
            h.engine.binding_copies_labels = False
            pod = kube.put("Pod", gpu_pod("a", memory_mib=1000))
            assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            await h.settle()
            kube.fail["patch pod"] = KubeError(500, "etcd is sad")
            assert (await h.bind(pod, "n1"))["Error"] == ""
            assert kube.pod("a")["spec"]["nodeName"] == "n1"
            assert names.VGPU_NODE not in kube.pod("a")["metadata"].get("labels", {})

    run(scenario)


@pytest.mark.parametrize("code", [409, 403])
def test_a_refused_binding_leaves_nothing_and_undoes_the_charge(code: int) -> None:
    """Better than HAMi, whose refused bind leaves the filter's annotations on the pod: the
    pod carries nothing, the ledger forgets the charge, and the pod's next filter and
    bind work."""
    async def scenario() -> None:
        kube = cluster(n1="cdi")
        async with serving(kube) as h:
            pod = kube.put("Pod", gpu_pod("a", memory_mib=1000))
            await h.filter(pod, ["n1"])
            kube.fail["bind"] = KubeError(code, "refused")
            assert (await h.bind(pod, "n1"))["Error"] == "refused"
            assert used_mib(h, "n1") == 0
            assert not any(k.startswith("hami.io/")
                           for k in kube.pod("a")["metadata"]["annotations"])
            del kube.fail["bind"]
            assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            assert used_mib(h, "n1") == 1000
            assert (await h.bind(pod, "n1"))["Error"] == ""
            assert kube.pod("a")["metadata"]["annotations"][names.VGPU_NODE] == "n1"
            await h.settle()
            assert used_mib(h, "n1") == 1000

    run(scenario)


def test_a_binding_lost_in_transport_keeps_the_charge_and_can_be_retried() -> None:
    """No answer (code 0): the Binding may have landed, so the charge stays, and a bind
    retried for the same filter still carries the allocation."""
    async def scenario() -> None:
        kube = cluster(n1="cdi")
        async with serving(kube) as h:
            pod = kube.put("Pod", gpu_pod("a", memory_mib=1000))
            await h.filter(pod, ["n1"])
            kube.fail["bind"] = KubeError(0, "connection reset")
            assert (await h.bind(pod, "n1"))["Error"] == "connection reset"
            assert used_mib(h, "n1") == 1000
            del kube.fail["bind"]
            assert (await h.bind(pod, "n1"))["Error"] == ""
            assert kube.pod("a")["metadata"]["annotations"][names.VGPU_NODE] == "n1"

    run(scenario)


def test_a_node_back_on_the_lock_between_filter_and_bind_gets_hamis_order() -> None:
    """The filter saw mode ``cdi`` and wrote nothing; by the bind the node runs HAMi's
    protocol again: lock, then the allocation patch, then the Binding."""
    async def scenario() -> None:
        kube = cluster(n1="cdi")
        async with serving(kube) as h:
            pod = kube.put("Pod", gpu_pod("a", memory_mib=1000))
            await h.filter(pod, ["n1"])
            await kube.patch_node("n1", {"metadata": {"annotations": {
                names.NODE_ALLOCATE_MODE: None}}})
            for _ in range(100):
                if not h.engine.lock_free("n1"):
                    break
                await asyncio.sleep(0.02)
            kube.calls.clear()
            assert (await h.bind(pod, "n1"))["Error"] == ""
            writes = [c for c in kube.calls if c in ("patch node", "patch pod", "bind")]
            assert writes == ["patch node", "patch pod", "bind"]
            assert (lock_of(kube, "n1") or "").endswith(",default,a")
            bound = kube.pod("a")["metadata"]
            assert bound["annotations"][names.BIND_PHASE] == "allocating"
            assert bound["labels"][names.VGPU_NODE] == "n1"

    run(scenario)


def test_a_cdi_binding_of_a_pod_with_another_vendor_s_devices_stays_allocating(
        tmp_path: Path) -> None:
    """Another vendor's device plugin follows HAMi's handshake (it looks for
    ``bind-phase=allocating`` under its lock): a pod that also holds such devices keeps
    ``allocating`` and every to-allocate string on a node in mode ``cdi``; an NVIDIA-only
    pod on the same node is final at its Binding."""
    config = tmp_path / "device-config.yaml"
    config.write_text(DEVICE_CONFIG)

    async def scenario() -> None:
        kube = FakeKube()
        n = mixed_node("m1")
        n["metadata"]["annotations"][names.NODE_ALLOCATE_MODE] = "cdi"
        kube.put("Node", n)
        async with serving(kube, device_config_file=str(config),
                           node_lock_retry_timeout=timedelta(seconds=1)) as h:
            both = kube.put("Pod", vendor_pod("both", NV, DCU))
            only = kube.put("Pod", vendor_pod("only", NV))
            for p in (both, only):
                assert (await h.filter(p, ["m1"]))["NodeNames"] == ["m1"]
            assert (await h.bind(both, "m1"))["Error"] == ""
            ann = kube.pod("both")["metadata"]["annotations"]
            assert ann[names.BIND_PHASE] == "allocating"
            assert ann[names.DEVICES_TO_ALLOCATE] == ann[names.DEVICES_ALLOCATED] != ";;"
            assert ann["hami.io/dcu-devices-to-allocate"] == ann["hami.io/dcu-devices-allocated"]
            assert (lock_of(kube, "m1") or "").endswith(",default,both")  # the DCU's lock
            assert (await h.bind(only, "m1"))["Error"] == ""
            ann = kube.pod("only")["metadata"]["annotations"]
            assert ann[names.BIND_PHASE] == "success" and ann[names.DEVICES_TO_ALLOCATE] == ";"

    run(scenario)


def test_a_lock_node_keeps_the_filter_patch() -> None:
    """HAMi's protocol unchanged where the node says nothing: the filter patches the pod
    (allocation, label, progress marks) and the Binding carries no annotations."""
    async def scenario() -> None:
        kube = cluster(n1=None)
        async with serving(kube) as h:
            pod = kube.put("Pod", gpu_pod("a", memory_mib=1000))
            kube.calls.clear()
            await h.filter(pod, ["n1"])
            await h.settle()
            assert kube.calls == ["patch pod"]
            ann = kube.pod("a")["metadata"]["annotations"]
            assert ann[names.VGPU_NODE] == "n1" and ann[names.BIND_PHASE] == "allocating"

    run(scenario)
