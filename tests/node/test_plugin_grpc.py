"""The device plugin behind a fake kubelet (real gRPC on unix sockets), fake GPUs and an
in-memory API: registration, re-registration, health, node annotation, Allocate."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.deviceplugin import allocate as al
from tests.node.conftest import DEFAULT_INVENTORY, NODE, PluginHarness, start_plugin

A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
UID_P = "0d6a0e1c-0000-4000-8000-00000000000p"


def wait(pred, timeout_s: float = 10.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def up(h: PluginHarness, **kw) -> None:  # type: ignore[no-untyped-def]
    start_plugin(h, **kw)
    h.kubelet.wait_registered()
    h.kubelet.wait_list(lambda d: len(d) > 0)


def bound_pod(h: PluginHarness, name: str, to_allocate: str, containers=("c",), n_init: int = 0,
              bind_time: str = "100", env=None, lock: bool = True) -> al.PodView:  # type: ignore[no-untyped-def]
    p = al.PodView("default", name, f"uid-{name}", NODE, "Pending",
                   {al.DEVICES_TO_ALLOCATE: to_allocate, al.VGPU_NODE: NODE,
                    al.BIND_PHASE: "allocating", al.BIND_TIME: bind_time},
                   tuple(al.ContainerView(c, env or {}) for c in containers), n_init)
    h.kube.add_pod(p)
    if lock:
        h.kube.patch_node_annotations(NODE, {al.NODE_LOCK: f"2026-11-29T08:00:00Z,default,{name}"})
    return p


# --- registration ---------------------------------------------------------------------------

def test_register_and_list_and_watch(harness: PluginHarness) -> None:
    up(harness)
    req = harness.kubelet.registrations[0]
    assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", "nvidia-gpu.sock",
                                                             "nvidia.com/gpu")
    assert req.options.get_preferred_allocation_available is True
    devs = harness.kubelet.latest
    assert devs == [(f"{A}-{i}", "Healthy") for i in range(10)] + \
        [(f"{B}-{i}", "Healthy") for i in range(10)]
    opts = harness.kubelet.options()
    assert opts.get_preferred_allocation_available and not opts.pre_start_required
    assert harness.kubelet.prestart() is not None


def test_node_register_annotation(harness: PluginHarness) -> None:
    up(harness)
    wait(lambda: "hami.io/node-nvidia-register" in harness.kube.nodes[NODE][0], what="annotation")
    value = harness.kube.nodes[NODE][0]["hami.io/node-nvidia-register"]
    assert value == (
        f'[{{"id":"{A}","count":10,"devmem":81920,"devcore":100,"type":"NVIDIA A100-SXM4-80GB",'
        f'"mode":"hami-core","health":true}},'
        f'{{"id":"{B}","index":1,"count":10,"devmem":15360,"devcore":100,"type":"NVIDIA-Tesla T4",'
        f'"numa":1,"mode":"hami-core","health":true}}]')
    # patched only when it changed: several intervals pass, still one patch
    patches = harness.kube.calls.count("patch_node")
    time.sleep(1.0)
    assert harness.kube.calls.count("patch_node") == patches == 1


def test_node_config_overrides(harness: PluginHarness) -> None:
    node_cfg = ('{"nodeconfig":[{"name":"other","devicesplitcount":2},{"name":"node-a",'
                '"devicesplitcount":4,"devicememoryscaling":1.5,"devicecorescaling":2,'
                '"operatingmode":"mps","filterdevices":{"uuid":[],"index":[1]}}]}')
    up(harness, config_yaml="nvidia:\n  deviceSplitCount: 7\n  libCudaLogLevel: '1'\n",
       node_config=node_cfg)
    assert harness.kubelet.latest == [(f"{A}-{i}", "Healthy") for i in range(4)]
    wait(lambda: "hami.io/node-nvidia-register" in harness.kube.nodes[NODE][0])
    assert harness.kube.nodes[NODE][0]["hami.io/node-nvidia-register"] == (
        f'[{{"id":"{A}","count":4,"devmem":122880,"devcore":200,'
        f'"type":"NVIDIA A100-SXM4-80GB","mode":"mps","health":true}}]')


def test_reregister_after_kubelet_restart(harness: PluginHarness) -> None:
    up(harness)
    harness.kubelet.restart(wipe=True)          # kubelet.sock recreated, our socket wiped
    harness.kubelet.wait_registered()
    wait(lambda: len(harness.kubelet.registrations) == 2, what="second registration")
    harness.kubelet.wait_list(lambda d: len(d) == 20)
    assert harness.kubelet.options().get_preferred_allocation_available
    # kubelet.sock recreated but our socket kept: registers again too
    harness.kubelet.restart(wipe=False)
    wait(lambda: len(harness.kubelet.registrations) == 3, what="third registration")


def test_plugin_server_restart_reregisters(harness: PluginHarness) -> None:
    up(harness)
    (harness.kubelet.dir / "nvidia-gpu.sock").unlink()   # our server's socket vanished
    wait(lambda: len(harness.kubelet.registrations) == 2, what="re-registration")
    harness.kubelet.wait_list(lambda d: len(d) == 20)


# --- health ---------------------------------------------------------------------------------

def test_health_events(harness: PluginHarness) -> None:
    up(harness)
    inv = {**DEFAULT_INVENTORY, "xid_events": [{"uuid": A, "xid": 13}, {"uuid": A, "xid": 43}]}
    harness.write_inventory(inv)                                   # ignored application XIDs
    time.sleep(0.8)
    assert all(h == "Healthy" for _, h in harness.kubelet.latest)
    harness.write_inventory({**inv, "xid_events": inv["xid_events"] + [{"uuid": B, "xid": 79}]})
    devs = harness.kubelet.wait_list(lambda d: any(h == "Unhealthy" for _, h in d))
    assert [i for i, h in devs if h == "Unhealthy"] == [f"{B}-{i}" for i in range(10)]
    assert [i for i, h in devs if h == "Healthy"] == [f"{A}-{i}" for i in range(10)]
    wait(lambda: '"health":true' not in harness.kube.nodes[NODE][0]
         .get("hami.io/node-nvidia-register", "").split(B)[-1], what="annotation health false")
    # GPU A turns unhealthy through the inventory's health flag; no recovery afterwards
    gpus = [dict(g) for g in DEFAULT_INVENTORY["gpus"]]
    gpus[0]["health"] = False
    harness.write_inventory({"gpus": gpus, "xid_events": inv["xid_events"]})
    harness.kubelet.wait_list(lambda d: all(h == "Unhealthy" for _, h in d))


def test_unknown_uuid_event_marks_all(harness: PluginHarness) -> None:
    up(harness)
    harness.write_inventory({**DEFAULT_INVENTORY, "xid_events": [{"uuid": "GPU-zzz", "xid": 48}]})
    harness.kubelet.wait_list(lambda d: all(h == "Unhealthy" for _, h in d))


def test_disable_healthchecks_env(harness: PluginHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DP_DISABLE_HEALTHCHECKS", "all")
    up(harness)
    harness.write_inventory({**DEFAULT_INVENTORY, "xid_events": [{"uuid": A, "xid": 79}]})
    time.sleep(0.8)
    assert all(h == "Healthy" for _, h in harness.kubelet.latest)


# --- Allocate ---------------------------------------------------------------------------------

def test_allocate_full_flow(harness: PluginHarness) -> None:
    up(harness)
    bound_pod(harness, "p", f"{A},NVIDIA,3000,30:{B},NVIDIA,4000,30:;")
    pref = harness.kubelet.preferred([i for i, _ in harness.kubelet.latest], 2)
    assert [al.physical_uuid(i) for i in pref] == [A, B]
    resp = harness.kubelet.allocate(pref)
    c = resp.container_responses[0]
    envs = dict(c.envs)
    cache = envs.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE")
    assert cache.startswith(f"{harness.hook_path}/vgpu/") and cache.endswith(".cache")
    assert envs == {"NVIDIA_VISIBLE_DEVICES": f"{A},{B}", "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
                    "CUDA_DEVICE_MEMORY_LIMIT_1": "4000m", "CUDA_DEVICE_SM_LIMIT": "30"}
    h = harness.hook_path
    assert [(m.container_path, m.host_path, m.read_only) for m in c.mounts] == [
        (f"{h}/vgpu/libvgpu.so", f"{h}/vgpu/libvgpu.so", True),
        (f"{h}/vgpu", f"{h}/vgpu/containers/uid-p_c", False),
        (f"{h}/vgpu/limits.env", f"{h}/vgpu/containers/uid-p_c.plugin/limits.env", True),
        (f"{h}/vgpu/feedback", f"{h}/vgpu/containers/uid-p_c.plugin/feedback", True),
        ("/tmp/vgpulock", f"{h}/vgpu/containers/uid-p_c.plugin/vgpulock", False),
        ("/etc/ld.so.preload", f"{h}/vgpu/ld.so.preload", True)]
    d = Path(f"{h}/vgpu/containers/uid-p_c")
    assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o777
    pod = harness.kube.pods[("default", "p")]
    assert pod.annotations[al.DEVICES_TO_ALLOCATE] == ";"
    assert pod.annotations[al.BIND_PHASE] == "success"
    wait(lambda: al.NODE_LOCK not in harness.kube.nodes[NODE][0], what="lock release")


def test_allocate_multi_container_keeps_lock_until_last(harness: PluginHarness) -> None:
    up(harness)
    bound_pod(harness, "p", f";{A},NVIDIA,1000,10:;{B},NVIDIA,2000,20:;",
              containers=("init", "c1", "c2"), n_init=1)
    r1 = harness.kubelet.allocate([f"{A}-0"]).container_responses[0]
    assert r1.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert r1.mounts[1].host_path.endswith("/uid-p_c1")
    pod = harness.kube.pods[("default", "p")]
    assert pod.annotations[al.BIND_PHASE] == "allocating"
    assert al.NODE_LOCK in harness.kube.nodes[NODE][0]
    r2 = harness.kubelet.allocate([f"{B}-0"]).container_responses[0]
    assert r2.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    pod = harness.kube.pods[("default", "p")]
    assert pod.annotations[al.BIND_PHASE] == "success"
    assert pod.annotations[al.DEVICES_TO_ALLOCATE] == ";;;"
    wait(lambda: al.NODE_LOCK not in harness.kube.nodes[NODE][0], what="lock release")


def test_allocate_count_mismatch_fails_pod_and_releases_lock(harness: PluginHarness) -> None:
    up(harness)
    bound_pod(harness, "p", f"{A},NVIDIA,1000,10:;")
    with pytest.raises(grpc.RpcError) as err:
        harness.kubelet.allocate([f"{A}-0", f"{B}-0"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "kubelet asks for 2 devices" in err.value.details()
    assert harness.kube.pods[("default", "p")].annotations[al.BIND_PHASE] == "failed"
    wait(lambda: al.NODE_LOCK not in harness.kube.nodes[NODE][0], what="lock release")


def test_allocate_patch_failure_marks_failed(harness: PluginHarness) -> None:
    up(harness)
    bound_pod(harness, "p", f"{A},NVIDIA,1000,10:;")
    harness.kube.fail_pod_patch = True
    with pytest.raises(grpc.RpcError):
        harness.kubelet.allocate([f"{A}-0"])
    wait(lambda: al.NODE_LOCK not in harness.kube.nodes[NODE][0], what="lock release")


def test_allocate_without_pod(harness: PluginHarness) -> None:
    up(harness)
    with pytest.raises(grpc.RpcError) as err:
        harness.kubelet.allocate([f"{A}-0"])
    assert "no pending pod" in err.value.details()


def test_allocate_lock_of_other_pod_is_not_released(harness: PluginHarness) -> None:
    up(harness)
    bound_pod(harness, "p", f"{A},NVIDIA,1000,10:;", lock=False)
    harness.kube.patch_node_annotations(NODE, {al.NODE_LOCK: "2026-11-29T08:00:00Z,default,zz"})
    harness.kubelet.allocate([f"{A}-0"])
    assert harness.kube.pods[("default", "p")].annotations[al.BIND_PHASE] == "success"
    assert harness.kube.nodes[NODE][0][al.NODE_LOCK].endswith(",default,zz")


def test_mig_ids_pass_through(harness: PluginHarness) -> None:
    up(harness)
    resp = harness.kubelet.allocate(["MIG-1234"])
    assert dict(resp.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": "MIG-1234"}


# --- field case B15 -----------------------------------------------------------------------------

def test_field_case_b15(harness: PluginHarness) -> None:
    """B15: eight whole cards; kubelet's own replica IDs cover five, the scheduler's eight win."""
    uuids = [f"GPU-{i}" for i in range(8)]  # eight 80 GiB H100s
    harness.write_inventory({"gpus": [
        {"model": "NVIDIA-H100-80GB", "memory_mib": 81920, "uuids": [u]} for u in uuids]})
    up(harness)
    value = "".join(f"{u},NVIDIA,81920,100:" for u in uuids) + ";"
    bound_pod(harness, "big", value)
    # kubelet asks for a preferred allocation first: one replica per annotated GPU
    avail = [i for i, _ in harness.kubelet.latest]
    assert harness.kubelet.options().get_preferred_allocation_available
    pref = harness.kubelet.preferred(avail, 8)
    assert len(pref) == 8
    assert [i.rsplit("-", 1)[0] for i in pref] == uuids
    # kubelet still sends IDs of its own choosing (5 physical GPUs): the annotation wins
    own = ["GPU-0-2", "GPU-0-6", "GPU-0-7", "GPU-0-9", "GPU-1-1", "GPU-1-6", "GPU-2-1", "GPU-3-1"]
    resp = harness.kubelet.allocate(own).container_responses[0]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert [resp.envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] for i in range(8)] == ["81920m"] * 8
    assert harness.kube.pods[("default", "big")].annotations[al.BIND_PHASE] == "success"


# --- two pods at once ---------------------------------------------------------------------------

def test_two_pods_allocated_at_once_keep_their_limits(harness: PluginHarness) -> None:
    up(harness)
    bound_pod(harness, "small", f"{A},NVIDIA,1000,10:;", bind_time="100")
    bound_pod(harness, "large", f"{A},NVIDIA,9000,90:{B},NVIDIA,9000,90:;", bind_time="100",
              lock=False)
    results: dict[str, dict[str, str]] = {}

    def go(name: str, ids: list[str]) -> None:
        results[name] = dict(harness.kubelet.allocate(ids).container_responses[0].envs)

    # kubelet serves 'large' first although the lock names 'small': told apart by counts
    threads = [threading.Thread(target=go, args=("large", [f"{A}-3", f"{B}-3"])),
               threading.Thread(target=go, args=("small", [f"{A}-5"]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["large"]["CUDA_DEVICE_MEMORY_LIMIT_1"] == "9000m"
    assert results["large"]["NVIDIA_VISIBLE_DEVICES"] == f"{A},{B}"
    assert results["small"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert results["small"]["CUDA_DEVICE_SM_LIMIT"] == "10"
    for name in ("small", "large"):
        assert harness.kube.pods[("default", name)].annotations[al.BIND_PHASE] == "success"
    wait(lambda: al.NODE_LOCK not in harness.kube.nodes[NODE][0], what="lock release")


def test_late_allocate_is_never_served_the_lock_owners_entry(harness: PluginHarness) -> None:
    """Issue 11 item 7: pod-a (1000 MiB) was bound first but its Allocate is late; the
    scheduler let pod-b (3000 MiB, same GPU) take the lock over. kubelet now admits
    pod-a: the request (one replica of GPU A, picked from our own preferred answer) fits
    both pods, so the plugin must refuse rather than hand pod-a pod-b's 3000 MiB."""
    up(harness)
    bound_pod(harness, "pod-a", f"{A},NVIDIA,1000,10:;", bind_time="100", lock=False)
    bound_pod(harness, "pod-b", f"{A},NVIDIA,3000,30:;", bind_time="200")   # lock: pod-b
    avail = [i for i, _ in harness.kubelet.latest]
    ids = harness.kubelet.preferred(avail, 1)
    assert [al.physical_uuid(i) for i in ids] == [A]
    with pytest.raises(grpc.RpcError) as err:                  # kubelet admitting pod-a
        harness.kubelet.allocate(ids)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot tell which pod" in err.value.details()
    for name, value in (("pod-a", f"{A},NVIDIA,1000,10:;"), ("pod-b", f"{A},NVIDIA,3000,30:;")):
        ann = harness.kube.pods[("default", name)].annotations
        assert (ann[al.DEVICES_TO_ALLOCATE], ann[al.BIND_PHASE]) == (value, "allocating")
    assert harness.kube.nodes[NODE][0][al.NODE_LOCK].endswith(",default,pod-b")
    assert not Path(f"{harness.hook_path}/vgpu/containers/uid-pod-a_c").exists()
    # kubelet rejects pod-a (phase Failed); pod-b's own Allocate is then unambiguous
    harness.kube.add_pod(replace(harness.kube.pods[("default", "pod-a")], phase="Failed"))
    envs = harness.kubelet.allocate(harness.kubelet.preferred(avail, 1)).container_responses[0]
    assert envs.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert envs.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert envs.mounts[1].host_path.endswith("/uid-pod-b_c")
    assert harness.kube.pods[("default", "pod-b")].annotations[al.BIND_PHASE] == "success"
    assert harness.kube.pods[("default", "pod-a")].annotations[al.DEVICES_TO_ALLOCATE] == (
        f"{A},NVIDIA,1000,10:;")
    wait(lambda: al.NODE_LOCK not in harness.kube.nodes[NODE][0], what="lock release")


def test_pod_that_changed_since_it_was_listed_is_not_served(harness: PluginHarness,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod picked from the node's pod list is read again before it is served; if it no
    longer waits (here: its entry was taken meanwhile) nothing is served or marked."""
    up(harness)
    bound_pod(harness, "p", f"{A},NVIDIA,1000,10:;", lock=False)
    listed = harness.kube.pods[("default", "p")]
    monkeypatch.setattr(harness.kube, "get_pod", lambda ns, name: replace(
        listed, annotations={**listed.annotations, al.DEVICES_TO_ALLOCATE: ";"}))
    with pytest.raises(grpc.RpcError) as err:
        harness.kubelet.allocate([f"{A}-0"])
    assert "default/p changed during Allocate" in err.value.details()
    assert harness.kube.pods[("default", "p")].annotations[al.BIND_PHASE] == "allocating"
    assert "patch_pod" not in harness.kube.calls


# --- fuzzed annotations ------------------------------------------------------------------------

_piece = st.sampled_from([A, B, "NVIDIA", "1000", "-5", "x", "", ",", ":", ";", "99999999999",
                          "\u00e9", " ", "0"])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(value=st.one_of(st.lists(_piece, max_size=14).map("".join), st.text(max_size=40)),
       n_ids=st.integers(0, 3), n_containers=st.integers(0, 3))
def test_fuzzed_annotation_never_crashes(harness: PluginHarness, value: str, n_ids: int,
                                         n_containers: int) -> None:
    if harness.thread is None:
        up(harness)
    harness.kube.pods.clear()
    bound_pod(harness, "f", value, containers=tuple(f"c{i}" for i in range(n_containers)))
    avail = [i for i, _ in harness.kubelet.latest]
    pref = harness.kubelet.preferred(avail[: 3 + n_ids], n_ids + n_containers,
                                     must=avail[:1] if n_containers == 2 else None)
    assert len(pref) <= n_ids + n_containers and set(pref) <= set(avail)
    try:
        resp = harness.kubelet.allocate([f"{A}-{i}" for i in range(n_ids)])
        assert len(resp.container_responses) == 1
        assert harness.kube.pods[("default", "f")].annotations[al.BIND_PHASE] in (
            "success", "allocating")
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err
        phase = harness.kube.pods[("default", "f")].annotations[al.BIND_PHASE]
        assert phase in ("failed", "allocating")     # allocating: pod was not chosen
    assert os.path.exists(harness.kubelet.dir / "nvidia-gpu.sock")


class _StaleWatch:
    """A node watch that lags behind: it never saw the scheduler's lock."""

    def get(self) -> tuple[dict[str, str], str]:
        return {}, "0"

    def offer(self, annotations: dict[str, str], rv: str) -> None:
        pass


def test_lagging_node_watch_still_serves_and_releases(harness: PluginHarness) -> None:
    harness.kube.node_watch = _StaleWatch()  # type: ignore[assignment]
    up(harness)
    bound_pod(harness, "p", f"{A},NVIDIA,1000,10:;")
    harness.kube.add_pod(al.PodView("default", "other", "uid-o", NODE, "Pending", {
        al.DEVICES_TO_ALLOCATE: f"{A},NVIDIA,5,5:{B},NVIDIA,5,5:;", al.VGPU_NODE: NODE,
        al.BIND_PHASE: "allocating", al.BIND_TIME: "1"}, (al.ContainerView("c"),)))
    envs = harness.kubelet.allocate([f"{A}-0"]).container_responses[0].envs
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    wait(lambda: al.NODE_LOCK not in harness.kube.nodes[NODE][0], what="lock release")
