"""A GPU sidecar (restartable init container, Kubernetes KEP-753) is served its own entry
of the grant by the device plugin's real gRPC server, in both allocate modes (issue 25
item 1). The grant keeps HAMi's order: init containers (the sidecar among them, in spec
order), then app containers; the kubelet allocates in that order, and with a sidecar it
gives the app container devices of its own (it reuses only an ordinary init
container's)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hami.deviceplugin import allocate as al
from tests.node.conftest import NODE, PluginHarness
from tests.node.test_cdi_mode import (  # noqa: F401 - the cdi fixture
    PodResources,
    cdi,
    env_of,
    phase,
    pod,
    prestart,
    spec,
)
from tests.node.test_plugin_grpc import A, bound_pod, up, wait

#: An ordinary init container without GPU, the sidecar's 2000 MiB / 20 %, the app's
#: 5000 MiB / 30 %, all on card A.
GRANT = f";{A},NVIDIA,2000,20:;{A},NVIDIA,5000,30:;"
CONTAINERS = ("warm", "side", "c")


def test_node_lock_mode_serves_the_sidecar_then_the_app_container(
        harness: PluginHarness) -> None:
    up(harness)
    p = bound_pod(harness, "p", GRANT, containers=CONTAINERS, n_init=2)
    harness.kube.add_pod(dataclasses.replace(p, sidecars=frozenset({"side"})))
    side = harness.kubelet.allocate([f"{A}-0"]).container_responses[0]
    assert side.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    assert side.envs["CUDA_DEVICE_SM_LIMIT"] == "20"
    assert side.mounts[1].host_path.endswith("/uid-p_side")
    assert al.NODE_LOCK in harness.kube.nodes[NODE][0]  # the app container is still to come
    app = harness.kubelet.allocate([f"{A}-1"]).container_responses[0]
    assert app.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5000m"
    assert app.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert app.mounts[1].host_path.endswith("/uid-p_c")
    assert side.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != \
        app.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    served = harness.kube.pods[("default", "p")]
    assert served.annotations[al.BIND_PHASE] == "success"
    assert served.annotations[al.DEVICES_TO_ALLOCATE] == ";;;"
    wait(lambda: al.NODE_LOCK not in harness.kube.nodes[NODE][0], what="lock release")


def test_cdi_mode_writes_the_sidecar_its_own_spec(
        cdi: tuple[PluginHarness, PodResources]) -> None:  # noqa: F811
    h, pr = cdi
    pod(h, "s", GRANT, containers=CONTAINERS, n_init=2)
    h.kubelet.allocate([f"{A}-0"])
    h.kubelet.allocate([f"{A}-1"])
    pr.listing = [("default", "s", "side", [f"{A}-0"]), ("default", "s", "c", [f"{A}-1"])]
    prestart(h, f"{A}-0")
    assert phase(h, "s") == "allocating"  # the app container is not served yet
    prestart(h, f"{A}-1")
    side, app = env_of(spec(h, f"{A}-0")), env_of(spec(h, f"{A}-1"))
    assert (side["CUDA_DEVICE_MEMORY_LIMIT_0"], side["CUDA_DEVICE_SM_LIMIT"]) == ("2000m", "20")
    assert (app["CUDA_DEVICE_MEMORY_LIMIT_0"], app["CUDA_DEVICE_SM_LIMIT"]) == ("5000m", "30")
    mounts = {m["containerPath"]: m["hostPath"]
              for m in spec(h, f"{A}-0")["devices"][0]["containerEdits"]["mounts"]}
    assert mounts[f"{h.hook_path}/vgpu"].endswith("/containers/uid-s_side")
    assert Path(mounts[f"{h.hook_path}/vgpu/limits.env"]).read_text().count("2000m") == 1
    assert phase(h, "s") == "success"
