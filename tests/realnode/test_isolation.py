"""Isolation settled by a real runtime: what a tenant's GPU pod that tries to walk around
its slice gets, with the webhook in place and where a pod gets past admission (the
webhook skipped for its namespace).

Facts asserted here are the ones docs/security.md states.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from lightkube import ApiError, codecs
from lightkube.resources.core_v1 import Event, Namespace, Pod

from hami.testing.controlplane import wait_until
from hami.testing.gpubed import GpuBed, gpu_test_pod

MiB = 1 << 20
BYPASS_NS = "no-webhook"


def with_env(manifest: dict[str, Any], **env: str) -> dict[str, Any]:
    manifest["spec"]["containers"][0]["env"] += [{"name": k, "value": v} for k, v in env.items()]
    return manifest


def preload_mount(manifest: dict[str, Any]) -> dict[str, Any]:
    """The container mounts an empty file of its own over /etc/ld.so.preload."""
    manifest["spec"]["volumes"].append({"name": "mine", "emptyDir": {}})
    manifest["spec"]["containers"][0]["volumeMounts"].append(
        {"name": "mine", "mountPath": "/etc/ld.so.preload", "subPath": "empty"})
    return manifest


@pytest.fixture(scope="module")
def bypass_ns(bed: GpuBed) -> str:
    """A namespace the webhook's namespaceSelector skips (label hami.io/webhook=ignore),
    as an administrator may configure: pods there are not admitted by hami."""
    bed.prepare_namespace(BYPASS_NS)
    c = bed.client()
    c.patch(Namespace, BYPASS_NS, {"metadata": {"labels": {"hami.io/webhook": "ignore"}}})
    c.close()
    return BYPASS_NS


@pytest.mark.parametrize("attack", ["env", "mount"])
def test_webhook_refuses_a_gpu_pod_that_overrides_its_limit(bed: GpuBed, client: Any,
                                                            attack: str) -> None:
    manifest = gpu_test_pod(f"refused-{attack}", "vgtest init info", memory_mib=512)
    if attack == "env":
        with_env(manifest, CUDA_DEVICE_MEMORY_LIMIT_0="16g")
    else:
        preload_mount(manifest)
    with pytest.raises(ApiError) as err:
        client.create(codecs.from_dict(manifest))
    assert err.value.status.code == 403
    assert ("CUDA_DEVICE_MEMORY_LIMIT_0" if attack == "env" else "/etc/ld.so.preload") in \
        err.value.status.message


def test_pod_past_admission_that_overrides_its_limit_is_never_placed(
        bed: GpuBed, client: Any, bypass_ns: str) -> None:
    """Webhook skipped, pod names hami's scheduler itself and sets its own limit: the
    extender's /filter repeats the isolation rules, so it stays Pending with the reason."""
    manifest = with_env(gpu_test_pod("override", "vgtest init info", memory_mib=512),
                        CUDA_DEVICE_MEMORY_LIMIT_0="16g")
    manifest["spec"]["schedulerName"] = "hami-scheduler"
    client.create(codecs.from_dict(manifest), namespace=bypass_ns)

    def refused() -> bool:
        events = client.list(Event, namespace=bypass_ns,
                             fields={"involvedObject.name": "override"})
        return any("CUDA_DEVICE_MEMORY_LIMIT_0" in (e.message or "") for e in events)

    wait_until(refused, timeout_s=30, what="FailedScheduling naming the reserved variable")
    pod = client.get(Pod, "override", namespace=bypass_ns)
    assert pod.status.phase == "Pending" and not pod.spec.nodeName
    client.delete(Pod, "override", namespace=bypass_ns, grace_period=0)


def test_gpu_pod_placed_around_hami_never_runs_on_a_slice(bed: GpuBed, client: Any,
                                                          bypass_ns: str) -> None:
    """Webhook skipped and the default scheduler places a GPU pod on the node by its
    nvidia.com/gpu count alone (a ``gpumem`` request would not fit anywhere: it is no
    node resource): it carries no signed allocation, so the device plugin's
    Allocate refuses it, the kubelet rejects the pod (UnexpectedAdmissionError) and its
    container never starts - it cannot run with the whole card or with another pod's
    slice."""
    manifest = gpu_test_pod("around", "echo started; vgtest init info")  # gpu: 1 only
    client.create(codecs.from_dict(manifest), namespace=bypass_ns)

    def rejected() -> bool:
        p = client.get(Pod, "around", namespace=bypass_ns)
        return p.status.phase == "Failed"

    wait_until(rejected, timeout_s=60, what="the kubelet rejects the pod")
    pod = client.get(Pod, "around", namespace=bypass_ns)
    assert pod.spec.nodeName == bed.node_name
    assert pod.status.reason == "UnexpectedAdmissionError", pod.status
    assert not pod.status.containerStatuses or all(
        cs.state.running is None and cs.state.terminated is None
        for cs in pod.status.containerStatuses)
    assert bed.node is not None and "started" not in bed.node.container_log(
        bypass_ns, "around", "c")
    client.delete(Pod, "around", namespace=bypass_ns, grace_period=0)
    # the node still serves hami's own pods afterwards
    time.sleep(1)
    client.create(codecs.from_dict(gpu_test_pod("after", "vgtest init info", memory_mib=256)))
    wait_until(lambda: client.get(Pod, "after").status.phase == "Succeeded", timeout_s=60,
               what="a hami pod runs after the refused one")
