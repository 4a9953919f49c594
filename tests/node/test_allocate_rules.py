"""Table-driven tests of the pure Allocate decisions (hami-core-spec §B.4-§B.6)."""

from __future__ import annotations

import pytest

from hami.core.model import ContainerDevice
from hami.deviceplugin import allocate as al
from hami.deviceplugin.config import PluginConfig

NODE = "node-a"
UID = "11111111-2222-3333-4444-555555555555"
SETTINGS = al.NodeSettings(hook_path="/usr/local", lock_dir="/tmp/vgpulock", version="0.1.0")


def pod(name: str = "p", to_allocate: str = "", containers: tuple[str, ...] = ("c",),
        n_init: int = 0, phase: str = "Pending", bind_phase: str | None = "allocating",
        bind_time: str | None = "100", node: str = NODE, env: dict[str, str] | None = None,
        uid: str = UID) -> al.PodView:
    ann = {al.DEVICES_TO_ALLOCATE: to_allocate, al.VGPU_NODE: node}
    if bind_phase is not None:
        ann[al.BIND_PHASE] = bind_phase
    if bind_time is not None:
        ann[al.BIND_TIME] = bind_time
    return al.PodView("default", name, uid, node, phase, ann,
                      tuple(al.ContainerView(c, env or {}) for c in containers), n_init)


# --- IDs and lock values -------------------------------------------------------------------

@pytest.mark.parametrize(("device_id", "replicas", "expected"), [
    ("GPU-0fc3eda5-e98b-a25b-5b0d-d8bd1ecb9d4a-3", None, "GPU-0fc3eda5-e98b-a25b-5b0d-d8bd1ecb9d4a"),
    ("GPU-0fc3eda5-e98b-a25b-5b0d-d8bd1ecb9d4a", None, "GPU-0fc3eda5-e98b-a25b-5b0d-d8bd1ecb9d4a"),
    ("GPU-abc::2", None, "GPU-abc"),
    ("GPU-0-7", None, "GPU-0-7"),                     # not 6 dashes, unknown: as-is
    ("GPU-0-7", {"GPU-0-7": "GPU-0"}, "GPU-0"),       # our own replica map wins
    ("MIG-xyz", None, "MIG-xyz"),
])
def test_physical_uuid(device_id: str, replicas: dict[str, str] | None, expected: str) -> None:
    assert al.physical_uuid(device_id, replicas) == expected


@pytest.mark.parametrize(("value", "owner", "releasable_by_p"), [
    (None, None, False),
    ("", None, False),
    ("2026-08-21T06:20:39Z", None, True),                       # legacy: anyone releases
    ("2026-08-21T06:20:39Z,default,p", ("default", "p"), True),
    ("2026-08-21T06:20:39Z,default,q", ("default", "q"), False),
    ("2026-08-21T06:20:39Z,default", None, False),              # malformed: 2 parts
    ("a,b,c,d", None, False),
])
def test_lock_owner_and_release(value: str | None, owner: tuple[str, str] | None,
                                releasable_by_p: bool) -> None:
    assert al.lock_owner(value) == owner
    assert al.lock_releasable(value, "default", "p") is releasable_by_p


# --- which pod -----------------------------------------------------------------------------

A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
REPL = {f"{u}-{i}": u for u in (A, B) for i in range(10)}


@pytest.mark.parametrize(("case", "expected"), [
    # (owner, candidates, request) -> chosen pod name
    ((pod("own", f"{A},NVIDIA,1000,30:;"), [], [[f"{A}-0"]]), "own"),
    ((None, [pod("x", f"{A},NVIDIA,1000,30:;")], [[f"{A}-1"]]), "x"),
    # candidate rules: not pending, no bind-time, wrong phase, other node, nothing left
    ((None, [pod("x", f"{A},NVIDIA,1,0:;", phase="Running")], [[f"{A}-1"]]), None),
    ((None, [pod("x", f"{A},NVIDIA,1,0:;", bind_time=None)], [[f"{A}-1"]]), None),
    ((None, [pod("x", f"{A},NVIDIA,1,0:;", bind_phase="failed")], [[f"{A}-1"]]), None),
    ((None, [pod("x", f"{A},NVIDIA,1,0:;", node="other")], [[f"{A}-1"]]), None),
    ((None, [pod("x", ";")], [[f"{A}-1"]]), None),
    ((None, [pod("x", f"{A},NVIDIA,1,0:;", bind_phase="success")], [[f"{A}-1"]]), "x"),
    # an owner that is not pending on this node is not the pod being admitted
    ((pod("own", f"{A},NVIDIA,1,0:;", phase="Running"), [], [[f"{A}-0"]]), None),
    ((pod("own", f"{A},NVIDIA,1,0:;", node="other"), [], [[f"{A}-0"]]), None),
    # the only pod waiting is served even when its counts differ (the count check then
    # fails that pod, as in HAMi)
    ((pod("own", f"{A},NVIDIA,1,0:;"), [], [[f"{A}-0", f"{B}-0"]]), "own"),
    # several pods wait: only one whose next entries have the requested counts is served
    ((None, [pod("a", f"{A},NVIDIA,1,0:{B},NVIDIA,1,0:;", bind_time="1"),
             pod("b", f"{A},NVIDIA,1,0:;", bind_time="9")], [["x-1"]]), "b"),
    ((pod("a", f"{A},NVIDIA,1,0:;"), [pod("a", f"{A},NVIDIA,1,0:;"),
                                     pod("b", f"{A},NVIDIA,1,0:{B},NVIDIA,1,0:;")],
      [[f"{A}-1", f"{B}-2"]]), "b"),
    # ... else nobody: the kubelet's IDs come from our own preferred allocation, which
    # had to guess as well, so neither the lock nor matching GPUs tell the pods apart
    # (issue 11 item 7: pod A was served pod B's 3000 MiB on their shared GPU)
    ((pod("b", f"{A},NVIDIA,3000,0:;", bind_time="9"),
      [pod("a", f"{A},NVIDIA,1000,0:;", bind_time="1")], [[f"{A}-3"]]), "!"),
    ((pod("a", f"{A},NVIDIA,1000,10:;"), [pod("a", f"{A},NVIDIA,1000,10:;"),
                                         pod("b", f"{B},NVIDIA,2000,20:;")], [[f"{B}-4"]]), "!"),
    ((None, [pod("a", f"{A},NVIDIA,1,0:;", bind_time="5"),
             pod("b", f"{B},NVIDIA,1,0:;", bind_time="1")], [[f"{A}-0"]]), "!"),
    ((None, [pod("b", f"{A},NVIDIA,1,0:;", bind_time="9"),
             pod("a", f"{A},NVIDIA,1,0:;", bind_time="1")], [["x-1"]]), "!"),
    ((None, [pod("a", f"{A},NVIDIA,1,0:;"), pod("b", f"{B},NVIDIA,1,0:;")],
      [[f"{A}-0", f"{B}-0"]]), "!"),                   # none fits: still nobody's
    # an owner with nothing left is stale: use the pending pod
    ((pod("own", ";"), [pod("x", f"{A},NVIDIA,1,0:;")], [[f"{A}-0"]]), "x"),
])
def test_choose_pod(case: tuple, expected: str | None) -> None:
    owner, candidates, request = case
    if expected == "!":
        with pytest.raises(al.AllocateError, match="cannot tell which pod") as err:
            al.choose_pod(request, owner, candidates, NODE, REPL)
        assert "default/a" in str(err.value) and "default/b" in str(err.value)
        return
    chosen = al.choose_pod(request, owner, candidates, NODE, REPL)
    assert (chosen.name if chosen else None) == expected


# --- the response --------------------------------------------------------------------------

def test_response_exact_strings() -> None:
    p = pod(to_allocate=f"{A},NVIDIA,3000,30:{B},NVIDIA,5000,0:;")
    plan = al.plan_allocation(p, [[f"{A}-0", f"{B}-0"]], PluginConfig(), SETTINGS, ["c4c4"])
    c = plan.containers[0]
    assert c.envs == {
        "NVIDIA_VISIBLE_DEVICES": f"{A},{B}",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "5000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/c4c4.cache",
    }
    assert [(m.container_path, m.host_path, m.read_only) for m in c.mounts] == [
        ("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True),
        ("/usr/local/vgpu", f"/usr/local/vgpu/containers/{UID}_c", False),
        ("/usr/local/vgpu/limits.env", f"/usr/local/vgpu/containers/{UID}_c.plugin/limits.env", True),
        ("/usr/local/vgpu/feedback", f"/usr/local/vgpu/containers/{UID}_c.plugin/feedback", True),
        ("/tmp/vgpulock", f"/usr/local/vgpu/containers/{UID}_c.plugin/vgpulock", False),
        ("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", True),
    ]
    assert c.host_dirs == (f"/usr/local/vgpu/containers/{UID}_c",
                           f"/usr/local/vgpu/containers/{UID}_c.plugin/vgpulock")
    assert c.host_files == ((f"/usr/local/vgpu/containers/{UID}_c.plugin/limits.env",
                             "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_MEMORY_LIMIT_1=5000m\n"
                             "CUDA_DEVICE_SM_LIMIT=30\n"
                             "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/c4c4.cache\n"),)
    # the monitor's feedback reaches libvgpu through a file of the private directory
    assert c.feedback_files == (f"/usr/local/vgpu/containers/{UID}_c.plugin/feedback",)
    assert plan.to_allocate == ";"
    assert plan.complete


@pytest.mark.parametrize(("cfg", "settings", "env", "extra_env", "mount_paths"), [
    (PluginConfig(device_memory_scaling=1.5), SETTINGS, {}, {"CUDA_OVERSUBSCRIBE": "true"}, None),
    (PluginConfig(device_memory_scaling=1.0), SETTINGS, {}, {}, None),
    (PluginConfig(libcuda_log_level="1"), SETTINGS, {}, {"LIBCUDA_LOG_LEVEL": "1"}, None),
    (PluginConfig(disable_core_limit=True), SETTINGS, {},
     {"GPU_CORE_UTILIZATION_POLICY": "disable"}, None),
    (PluginConfig(), SETTINGS, {"CUDA_DISABLE_CONTROL": "true"}, {},
     ["/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu", "/usr/local/vgpu/limits.env", "/usr/local/vgpu/feedback", "/tmp/vgpulock"]),
    (PluginConfig(), SETTINGS, {"CUDA_DISABLE_CONTROL": "T"}, {},
     ["/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu", "/usr/local/vgpu/limits.env", "/usr/local/vgpu/feedback", "/tmp/vgpulock"]),
    (PluginConfig(), SETTINGS, {"CUDA_DISABLE_CONTROL": "yes"}, {},    # Go ParseBool: not true
     ["/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu", "/usr/local/vgpu/limits.env", "/usr/local/vgpu/feedback", "/tmp/vgpulock", "/etc/ld.so.preload"]),
    (PluginConfig(), al.NodeSettings(license=True), {}, {},
     ["/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu", "/usr/local/vgpu/limits.env", "/usr/local/vgpu/feedback", "/tmp/vgpulock", "/etc/ld.so.preload",
      "/tmp/license", "/usr/bin/vgpuvalidator"]),
])
def test_response_options(cfg: PluginConfig, settings: al.NodeSettings, env: dict[str, str],
                          extra_env: dict[str, str], mount_paths: list[str] | None) -> None:
    p = pod(to_allocate=f"{A},NVIDIA,1000,0:;", env=env)
    c = al.plan_allocation(p, [[f"{A}-0"]], cfg, settings, ["x"]).containers[0]
    for k in ("CUDA_OVERSUBSCRIBE", "LIBCUDA_LOG_LEVEL", "GPU_CORE_UTILIZATION_POLICY"):
        assert c.envs.get(k) == extra_env.get(k)
    if mount_paths is not None:
        assert [m.container_path for m in c.mounts] == mount_paths


@pytest.mark.parametrize(("cfg", "env", "line"), [
    (PluginConfig(disable_core_limit=True), {}, "GPU_CORE_UTILIZATION_POLICY=disable\n"),
    (PluginConfig(), {"GPU_CORE_UTILIZATION_POLICY": "disable"}, "GPU_CORE_UTILIZATION_POLICY=disable\n"),
    (PluginConfig(disable_core_limit=True), {"GPU_CORE_UTILIZATION_POLICY": "force"},
     "GPU_CORE_UTILIZATION_POLICY=force\n"),
    (PluginConfig(), {}, None),
])
def test_limits_file_carries_the_core_policy(cfg: PluginConfig, env: dict[str, str], line: str | None) -> None:
    """libvgpu lets a process's env tighten the file's policy only (issue 26 §2): the policy
    the plugin or the webhook chose must be in the file, or a legitimately disabled limiter
    would come back on."""
    p = pod(to_allocate=f"{A},NVIDIA,1000,30:;", env=env)
    c = al.plan_allocation(p, [[f"{A}-0"]], cfg, SETTINGS, ["x"]).containers[0]
    ((_, text),) = c.host_files
    policy = [ln + "\n" for ln in text.splitlines() if ln.startswith("GPU_CORE_UTILIZATION_POLICY=")]
    assert policy == ([line] if line else [])


def test_versioned_lib_and_hook_path() -> None:
    p = pod(to_allocate=f"{A},NVIDIA,1000,0:;")
    s = al.NodeSettings(hook_path="/opt/h/", versioned_lib=True, version="2.10.0", lock_dir="/x/l")
    c = al.plan_allocation(p, [[f"{A}-0"]], PluginConfig(), s, ["u"]).containers[0]
    assert c.mounts[0] == al.Mount("/opt/h/vgpu/libvgpu.so", "/opt/h/vgpu/libvgpu.so.2.10.0", True)
    assert c.mounts[2] == al.Mount("/opt/h/vgpu/limits.env", f"/opt/h/vgpu/containers/{UID}_c.plugin/limits.env",
                                   True)
    assert c.mounts[3] == al.Mount("/opt/h/vgpu/feedback", f"/opt/h/vgpu/containers/{UID}_c.plugin/feedback",
                                   True)
    assert c.mounts[4] == al.Mount("/tmp/vgpulock", f"/opt/h/vgpu/containers/{UID}_c.plugin/vgpulock", False)
    assert c.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/opt/h/vgpu/u.cache"


def test_pop_in_container_order_with_init_and_empty_entries() -> None:
    # init container without GPU, init with GPU, app without GPU, app with 2 GPUs
    value = f";{A},NVIDIA,100,10:;;{A},NVIDIA,200,20:{B},NVIDIA,300,30:;"
    p = pod(to_allocate=value, containers=("i0", "i1", "a0", "a1"), n_init=2)
    plan = al.plan_allocation(p, [[f"{A}-0"]], PluginConfig(), SETTINGS, ["u"])
    assert plan.containers[0].container_name == "i1"
    assert plan.containers[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "100m"
    assert plan.to_allocate == f";;;{A},NVIDIA,200,20:{B},NVIDIA,300,30:;"
    assert not plan.complete
    p2 = pod(to_allocate=plan.to_allocate, containers=("i0", "i1", "a0", "a1"), n_init=2)
    plan2 = al.plan_allocation(p2, [[f"{A}-1", f"{B}-1"]], PluginConfig(), SETTINGS, ["v"])
    c = plan2.containers[0]
    assert c.container_name == "a1"
    assert c.envs["CUDA_DEVICE_SM_LIMIT"] == "20"          # first device's cores for all
    assert plan2.to_allocate == ";;;;"
    assert plan2.complete


def test_several_requests_in_one_call() -> None:
    value = f"{A},NVIDIA,100,10:;{B},NVIDIA,200,20:;"
    p = pod(to_allocate=value, containers=("a", "b"))
    plan = al.plan_allocation(p, [[f"{A}-0"], [f"{B}-0"]], PluginConfig(), SETTINGS, ["1", "2"])
    assert [c.container_name for c in plan.containers] == ["a", "b"]
    assert plan.complete and plan.to_allocate == ";;"


@pytest.mark.parametrize(("value", "request_ids", "message"), [
    (f"{A},NVIDIA,100,10:;", [[f"{A}-0", f"{B}-0"]], "kubelet asks for 2 devices"),
    (";;", [[f"{A}-0"]], "no devices left"),
    (f"{A},NVIDIA,100:;", [[f"{A}-0"]], "bad hami.io/vgpu-devices-to-allocate"),
    (f"{A},NVIDIA,1x,0:;", [[f"{A}-0"]], "bad hami.io/vgpu-devices-to-allocate"),
    (f";;{A},NVIDIA,1,0:;", [[f"{A}-0"]], "has no container"),
])
def test_failures(value: str, request_ids: list[list[str]], message: str) -> None:
    with pytest.raises(al.AllocateError, match=message):
        al.plan_allocation(pod(to_allocate=value), request_ids, PluginConfig(), SETTINGS, ["u"])


# --- GetPreferredAllocation --------------------------------------------------------------

def test_preferred_follows_annotation() -> None:
    entry = (ContainerDevice(A, "NVIDIA", 1, 0), ContainerDevice(B, "NVIDIA", 1, 0))
    avail = tuple(f"{u}-{i}" for u in (A, B) for i in range(3))
    req = al.PreferredRequest(avail, (), 2)
    assert al.preferred_ids(req, entry, REPL) == [f"{A}-0", f"{B}-0"]
    # must-include counts first; its GPU is not picked twice
    req = al.PreferredRequest(avail, (f"{B}-2",), 2)
    assert al.preferred_ids(req, entry, REPL) == [f"{B}-2", f"{A}-0"]
    # no annotation: spread over distinct GPUs first
    req = al.PreferredRequest(avail, (), 2)
    assert al.preferred_ids(req, None, REPL) == [f"{A}-0", f"{B}-0"]
    # more than GPUs: fill with any
    req = al.PreferredRequest(avail, (), 3)
    assert al.preferred_ids(req, None, REPL) == [f"{A}-0", f"{B}-0", f"{A}-1"]
