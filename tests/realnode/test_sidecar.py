"""A GPU sidecar (restartable init container, ``restartPolicy: Always``, Kubernetes
KEP-753) on the real kubelet and containerd, in both allocate modes (issue 25 item 1).

One 16384 MiB card. A pod with a 6000 MiB GPU sidecar and a 6000 MiB GPU app container:
each container sees its own limit (env and the read-only ``limits.env``), and the card is
booked for both for the pod's life, so a 6000 MiB pod that would fit if only the app
container were booked (6000 + 6000 <= 16384) stays Pending until the pod ends; then it
runs. Before sidecars were charged as such, the second pod was placed beside them.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, codecs
from lightkube.resources.core_v1 import Event, Pod, ResourceQuota

from hami.testing.controlplane import wait_until
from hami.testing.gpubed import GpuBed, default_inventory, gpu_test_pod, wait_pod_done
from hami.testing.gpubed_cli import plugin_args
from hami.testing.gpupods import STUB_DIR, stub_uuid
from tests.realnode.conftest import running_bed, skip_or_fail

MiB = 1 << 20
SHOW = ("env | grep -E '^(NVIDIA_VISIBLE_DEVICES|CUDA_DEVICE_[A-Z_0-9]*)=' | sort; "
        "sed 's/^/limits /' \"${CUDA_DEVICE_MEMORY_SHARED_CACHE%/*}/limits.env\"; "
        "vgtest init info")
RELEASE = "release-sidecar-pod"
#: The app container holds the pod Running until the test drops the release file on
#: the node (the stub driver's hostPath), at most 120 s.
APP = (f"{SHOW}; i=0; while [ ! -e {STUB_DIR}/{RELEASE} ] && [ $i -lt 240 ]; do "
       "sleep 0.5; i=$((i+1)); done")
SIDECAR = f"{SHOW}; exec sleep 3600"


@pytest.fixture(scope="module", params=["node-lock", "cdi"])
def bed(request: pytest.FixtureRequest) -> Iterator[GpuBed]:
    mode = request.param
    if mode == "cdi":
        from hami.testing import node as nodemod

        if not hasattr(nodemod.RealNode, "cdi_dir"):
            skip_or_fail("the real node has no containerd with CDI in this tree")
    workdir = Path(tempfile.mkdtemp(prefix="hb", dir="/tmp"))  # short: socket paths
    try:
        with running_bed(workdir=workdir, inventory=default_inventory(gpus=1),
                         plugin_args=plugin_args(mode)) as b:
            yield b
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # nothing left on the host


@pytest.fixture
def client(bed: GpuBed) -> Iterator[Any]:
    c = bed.client()
    yield c
    for p in c.list(Pod, namespace="default"):
        c.delete(Pod, p.metadata.name, namespace="default", grace_period=0)
    wait_until(lambda: not list(c.list(Pod, namespace="default")), timeout_s=60,
               what="the test's pods deleted")
    assert bed.node is not None
    bed.node.host_path(f"{STUB_DIR}/{RELEASE}").unlink(missing_ok=True)
    c.close()


def sidecar_pod(name: str = "with-sidecar", mib: int = 6000) -> dict[str, Any]:
    manifest = gpu_test_pod(name, APP, memory_mib=mib, stub_devices=1)
    side = copy.deepcopy(manifest["spec"]["containers"][0])
    side.update(name="side", restartPolicy="Always", command=["sh", "-c", SIDECAR])
    for e in side["env"]:
        if e["name"] == "HAMI_CONTAINER":
            e["value"] = "side"
    manifest["spec"]["initContainers"] = [side]
    return manifest


def parsed(log: str) -> tuple[dict[str, str], dict[str, str], list[int]]:
    """(env, limits.env, the first ``info`` line) of a container's log."""
    env, limits, info = {}, {}, []
    for ln in log.splitlines():
        if ln.startswith("limits "):
            k, _, v = ln[len("limits "):].partition("=")
            limits[k] = v
        elif ln.startswith("info ") and not info:
            info = [int(x) for x in ln.split()[1:]]
        elif "=" in ln and ln.split("=")[0].isupper():
            k, _, v = ln.partition("=")
            env[k] = v
    return env, limits, info


def log_of(bed: GpuBed, pod: str, container: str) -> str:
    assert bed.node is not None
    return bed.node.container_log("default", pod, container)


def test_sidecar_and_app_each_get_their_slice_and_the_card_is_booked_for_both(
        bed: GpuBed, client: Any) -> None:
    client.create(codecs.from_dict(sidecar_pod()))

    def started() -> bool:
        # the kubelet reports the phase a moment after both containers have started and
        # logged (seen Pending in CI right after both logs were there): wait for both
        reported = all("info " in log_of(bed, "with-sidecar", c) for c in ("side", "c"))
        pod = client.get(Pod, "with-sidecar")
        return reported and pod.status is not None and pod.status.phase == "Running"

    wait_until(started, timeout_s=120,
               what="sidecar and app container report their slice, the pod Running")
    pod = client.get(Pod, "with-sidecar")
    card = stub_uuid(0)
    assert pod.metadata.annotations["hami.io/vgpu-devices-allocated"] == \
        f"{card},NVIDIA,6000,0:;{card},NVIDIA,6000,0:;"
    caches = set()
    for ctr in ("side", "c"):
        log = log_of(bed, "with-sidecar", ctr)
        env, limits, info = parsed(log)
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "6000m", log
        assert limits["CUDA_DEVICE_MEMORY_LIMIT_0"] == "6000m", log
        assert env["NVIDIA_VISIBLE_DEVICES"] == card, log
        assert info[1] == 6000 * MiB, log  # cuMemGetInfo's total is the container's slice
        caches.add(limits["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    assert len(caches) == 2  # one region each: the sidecar is served its own entry

    # 6000 more MiB fit beside the app container alone, not beside app + sidecar
    client.create(codecs.from_dict(gpu_test_pod("neighbour", SHOW, memory_mib=6000,
                                                stub_devices=1)))

    def refused() -> bool:
        events = client.list(Event, namespace="default",
                             fields={"involvedObject.name": "neighbour"})
        return any("CardInsufficientMemory" in (e.message or "") for e in events)

    wait_until(refused, timeout_s=60, what="the neighbour refused for the card's memory")
    neighbour = client.get(Pod, "neighbour")
    assert neighbour.status.phase == "Pending" and not neighbour.spec.nodeName

    # the pod ends (its sidecar is stopped with it): the card is free, the neighbour runs
    assert bed.node is not None
    bed.node.host_path(f"{STUB_DIR}/{RELEASE}").touch()
    done = wait_pod_done(client, "with-sidecar", timeout_s=90)
    assert done.status.phase == "Succeeded", done.status
    done = wait_pod_done(client, "neighbour", timeout_s=120)
    log = log_of(bed, "neighbour", "c")
    assert done.status.phase == "Succeeded", log
    assert parsed(log)[2][1] == 6000 * MiB, log


def test_a_sidecar_does_not_pass_the_namespace_quota(bed: GpuBed, client: Any) -> None:
    """Attacker: under a 10000 MiB GPU quota, 6000 MiB in a sidecar and 6000 MiB in the
    app container are refused at creation (before: admitted, 6000 MiB charged); honest:
    5000 + 5000 MiB are admitted."""
    bed.prepare_namespace("tenant")
    client.apply(codecs.from_dict({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": "tenant"},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "10000"}}}), field_manager="test")
    attack = codecs.from_dict(sidecar_pod("over-quota", 6000))
    refusal: list[str] = []

    def refused() -> bool:  # the scheduler's quota watch may lag the create of the quota
        try:
            client.create(attack, namespace="tenant")
        except ApiError as err:
            refusal.append(err.status.message or "")
            return "exceeding resource quota" in refusal[-1]
        client.delete(Pod, "over-quota", namespace="tenant", grace_period=0)
        wait_until(lambda: not list(client.list(Pod, namespace="tenant")), timeout_s=60,
                   what="the admitted pod gone")
        return False

    wait_until(refused, timeout_s=30, what="the over-quota sidecar pod refused")
    assert "asks for 12000 MiB" in refusal[-1], refusal[-1]
    honest = client.create(codecs.from_dict(sidecar_pod("in-quota", 5000)), namespace="tenant")
    assert honest.metadata.name == "in-quota"
    client.delete(Pod, "in-quota", namespace="tenant", grace_period=0)
    client.delete(ResourceQuota, "gpu", namespace="tenant")
    wait_until(lambda: not list(client.list(Pod, namespace="tenant")), timeout_s=60,
               what="the tenant's pods gone")
