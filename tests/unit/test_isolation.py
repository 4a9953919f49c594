"""What a pod spec may not do to a GPU slice (issue 12 §3): attacker-style pods at the
webhook (:func:`hami.core.admission.admit`) and the same checks repeated by the filter
(:meth:`hami.core.state.ClusterState.filter`) for a pod that never met the webhook."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from hami.core.admission import admit
from hami.core.codec import encode_node_devices
from hami.core.config import SchedulerConfig
from hami.core.isolation import normalise_path, prefix_reaches_reserved
from hami.core.model import DeviceInfo
from hami.core.request import RequestError
from hami.core.state import ClusterState
from hami.devices.nvidia import NvidiaConfig
from hami.devices.registry import make_config
from tests.builders import container, pod

CONFIG = make_config()
HIDING = make_config(nvidia=NvidiaConfig(overwrite_env=True))


def node(name: str) -> dict[str, Any]:
    register = encode_node_devices([DeviceInfo(uuid=f"GPU-{name}-0", index=0, split_count=10,
                                               memory_mib=24576, cores_percent=100,
                                               type="NVIDIA-A10", mode="hami-core",
                                               health=True)])
    return {"metadata": {"name": name, "annotations": {"hami.io/node-nvidia-register": register}}}


def gpu(name: str = "main", **fields: Any) -> dict[str, Any]:
    c = container(name, gpu=1, gpumem=4000)
    c.update(fields)
    return c


def denied(p: dict[str, Any], config: SchedulerConfig = CONFIG) -> str:
    result = admit(p, config)
    assert not result.allowed, f"admitted: {p['spec']}"
    assert result.code == 403 and result.patch == []
    return result.message


def filter_refusal(p: dict[str, Any], config: SchedulerConfig = CONFIG) -> str:
    state = ClusterState(config)
    state.upsert_node(node("n1"))
    with pytest.raises(RequestError) as err:
        state.filter(p, ["n1"])
    return str(err.value)


# --- env -----------------------------------------------------------------------------

RESERVED = ["CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_MEMORY_LIMIT_15",
            "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_SM_LIMIT_1", "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "CUDA_DISABLE_CONTROL", "CUDA_OVERSUBSCRIBE", "CUDA_REDIRECT",
            "NVIDIA_VISIBLE_DEVICES", "LD_PRELOAD", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY",
            "CUDA_TASK_PRIORITY", "GPU_CORE_UTILIZATION_POLICY"]


@pytest.mark.parametrize("name", RESERVED)
def test_reserved_env_in_a_gpu_container_is_denied_and_refused_by_the_filter(name: str) -> None:
    attack = pod(containers=[gpu(env=[{"name": "APP", "value": "1"},
                                      {"name": name, "value": "80g"}])])
    message = denied(attack)
    assert f"container main: env {name} is reserved" in message
    assert filter_refusal(attack) == message  # the webhook was bypassed: same refusal
    by_ref = pod(containers=[gpu(env=[{"name": name, "valueFrom": {
        "configMapKeyRef": {"name": "cm", "key": "k"}}}])])
    assert f"env {name} is reserved" in denied(by_ref)


def test_the_issue_s_attack_pod_is_denied_naming_every_field() -> None:
    attack = pod(containers=[gpu("cuda", env=[
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"},
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"},
        {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
        {"name": "LD_PRELOAD", "value": "/tmp/mine.so"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        volumeMounts=[{"name": "v", "mountPath": "/etc/ld.so.preload"}])])
    message = denied(attack)
    for field in ("env CUDA_DEVICE_MEMORY_LIMIT_0", "env CUDA_DEVICE_SM_LIMIT",
                  "env CUDA_DISABLE_CONTROL", "env LD_PRELOAD", "env NVIDIA_VISIBLE_DEVICES"):
        assert f"container cuda: {field} is reserved" in message
    assert "and 1 more" in message  # the mount, sixth problem


def test_env_names_are_case_sensitive_and_other_names_stay_allowed() -> None:
    """getenv is case-sensitive: lower-case look-alikes are ordinary variables."""
    ok = pod(containers=[gpu(env=[{"name": "cuda_device_memory_limit_0", "value": "80g"},
                                  {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
                                  {"name": "LIBCUDA_LOG_LEVEL", "value": "4"}])])
    assert admit(ok, CONFIG).allowed
    upper = copy.deepcopy(ok)
    upper["spec"]["containers"][0]["env"][0]["name"] = "CUDA_DEVICE_MEMORY_LIMIT_0"
    assert "env CUDA_DEVICE_MEMORY_LIMIT_0 is reserved" in denied(upper)


def test_webhook_written_env_is_accepted_only_with_the_webhook_s_value() -> None:
    config = make_config(nvidia=NvidiaConfig(gpu_core_policy="force"))
    same = pod(containers=[gpu(env=[{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}])])
    assert admit(same, config).allowed
    escape = pod(containers=[gpu(env=[{"name": "GPU_CORE_UTILIZATION_POLICY",
                                       "value": "disable"}])])
    assert "GPU_CORE_UTILIZATION_POLICY is reserved (hami sets it from the gpuCorePolicy" \
        in denied(escape, config)
    first = pod(containers=[container("main", gpu=1, priority=1)])
    first["spec"]["containers"][0]["env"] = [{"name": "CUDA_TASK_PRIORITY", "value": "0"}]
    assert "CUDA_TASK_PRIORITY is reserved (hami sets it from the nvidia.com/priority" \
        in denied(first)


def test_a_pod_the_webhook_mutated_passes_the_filter_s_checks() -> None:
    config = make_config(nvidia=NvidiaConfig(gpu_core_policy="force", overwrite_env=True))
    p = pod(containers=[container("g", gpu=1, gpumem=3000, priority=1), container("side")])
    p["spec"]["containers"][1]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    result = admit(p, config)
    assert result.allowed
    state = ClusterState(config)
    state.upsert_node(node("n1"))
    assert state.filter(result.pod, ["n1"]).result.node == "n1"
    # the same pod straight to the filter (webhook bypassed): its sidecar still sees all GPUs
    assert "container side asks for no GPU but does not end with NVIDIA_VISIBLE_DEVICES=none" \
        in filter_refusal(p, config)


# --- envFrom -----------------------------------------------------------------------------

@pytest.mark.parametrize(("source", "why"), [
    ({"configMapRef": {"name": "app"}}, "has no prefix, so its keys could set the reserved"),
    ({"secretRef": {"name": "s"}, "prefix": ""}, "has no prefix"),
    ({"configMapRef": {"name": "app"}, "prefix": "CUDA_"}, "has prefix 'CUDA_'"),
    ({"configMapRef": {"name": "app"}, "prefix": "LD_"}, "the reserved LD_PRELOAD"),
    ({"configMapRef": {"name": "app"}, "prefix": "NVIDIA_"}, "the reserved NVIDIA_VISIBLE"),
    ({"configMapRef": {"name": "app"}, "prefix": "GPU_"}, "the reserved GPU_CORE_UTIL"),
    ({"configMapRef": {"name": "app"}, "prefix": "CUDA_DEVICE_MEMORY_LIMIT"},
     "the reserved CUDA_DEVICE_MEMORY_LIMIT_0"),
    ({"configMapRef": {"name": "app"}, "prefix": "CUDA_DEVICE_SM_LIMIT_"},
     "the reserved CUDA_DEVICE_SM_LIMIT_0"),
])
def test_env_from_that_could_set_reserved_names_is_denied(source: dict[str, Any],
                                                          why: str) -> None:
    attack = pod(containers=[gpu(envFrom=[source])])
    message = denied(attack)
    assert "container main: envFrom[0]" in message and why in message
    assert filter_refusal(attack) == message


def test_env_from_with_a_harmless_prefix_and_env_from_in_a_cpu_container_are_allowed() -> None:
    ok = pod(containers=[gpu(envFrom=[{"configMapRef": {"name": "app"}, "prefix": "APP_"},
                                      {"configMapRef": {"name": "x"}, "prefix": "cuda_"}]),
                         container("cpu")])
    ok["spec"]["containers"][1]["envFrom"] = [{"configMapRef": {"name": "app"}}]
    assert admit(ok, CONFIG).allowed
    assert prefix_reaches_reserved("APP_") == "" and prefix_reaches_reserved("CUDA_DEV")
    bare = copy.deepcopy(ok)
    del bare["spec"]["containers"][0]["envFrom"][0]["prefix"]
    assert "envFrom[0] (configMapRef app) has no prefix" in denied(bare)


# --- mounts ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [
    "/etc/ld.so.preload", "//etc//ld.so.preload/", "/etc/./ld.so.preload", "etc/ld.so.preload",
    "/usr/local/vgpu", "/usr/local/vgpu/", "/usr/local/vgpu/libvgpu.so",
    "/usr/local/vgpu/1234.cache", "/usr/local/lib/../vgpu/libvgpu.so", "/tmp/vgpulock",
    "/tmp/vgpulock/lock", "/usr/bin/vgpuvalidator",
])
def test_mounts_on_or_inside_the_plugin_s_paths_are_denied(path: str) -> None:
    attack = pod(containers=[gpu(volumeMounts=[{"name": "ok", "mountPath": "/data"},
                                               {"name": "v", "mountPath": path}])])
    message = denied(attack)
    assert f"container main: volumeMounts[1] mountPath {path} lies on" in message
    assert filter_refusal(attack) == message


def test_mounts_above_or_beside_the_plugin_s_paths_are_allowed_and_hook_path_counts() -> None:
    mounts = [{"name": str(i), "mountPath": p} for i, p in enumerate(
        ["/tmp", "/etc", "/usr/local", "/usr/local/vgpu2", "/etc/ld.so.preload.d", "/dev/shm"])]
    assert admit(pod(containers=[gpu(volumeMounts=mounts)]), CONFIG).allowed
    elsewhere = make_config(hook_path="/opt/hami/")
    attack = pod(containers=[gpu(volumeMounts=[{"name": "v", "mountPath": "/opt/hami/vgpu"}])])
    assert "lies on /opt/hami/vgpu" in denied(attack, elsewhere)
    assert normalise_path("//a/./b/../c/") == "/a/c"


def test_mounts_in_a_container_without_gpu_are_not_checked_but_gpu_init_ones_are() -> None:
    side = container("side")
    side["volumeMounts"] = [{"name": "v", "mountPath": "/usr/local/vgpu"}]
    assert admit(pod(containers=[gpu(), side]), CONFIG).allowed
    init = pod(containers=[container("main")],
               init=[gpu("warmup", volumeMounts=[{"name": "v", "mountPath": "/tmp/vgpulock"}])])
    assert "container warmup: volumeMounts[0]" in denied(init)


# --- pod security --------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["hostPID", "hostIPC"])
def test_host_namespaces_are_denied_for_gpu_pods(key: str) -> None:
    attack = pod(containers=[gpu()], **{key: True})
    message = denied(attack)
    assert message.startswith(f"spec.{key} is true")
    assert filter_refusal(attack) == message
    assert admit(pod(containers=[container()], **{key: True}), CONFIG).allowed  # no GPU


@pytest.mark.parametrize("cap", ["SYS_ADMIN", "CAP_SYS_ADMIN", "sys_admin", "ALL",
                                 "DAC_READ_SEARCH", "SYS_MODULE", "SYS_RAWIO"])
def test_capabilities_that_undo_the_mounts_are_denied_in_every_container(cap: str) -> None:
    side = container("side")
    side["securityContext"] = {"capabilities": {"add": ["NET_BIND_SERVICE", cap]}}
    attack = pod(containers=[gpu(), side])
    message = denied(attack)
    assert f"container side: securityContext.capabilities.add {cap} is not allowed" in message
    assert filter_refusal(attack) == message


def test_privileged_is_refused_by_the_filter_too_and_ordinary_capabilities_pass() -> None:
    attack = pod(containers=[gpu(securityContext={"privileged": True})])
    assert filter_refusal(attack) == "container main is privileged"
    ok = pod(containers=[gpu(securityContext={"capabilities": {"add": ["IPC_LOCK", "SYS_PTRACE"]}})],
             hostNetwork=True)
    assert admit(ok, CONFIG).allowed


# --- containers without a GPU ------------------------------------------------------------

def test_a_cpu_container_ends_with_visible_devices_none_even_if_it_set_all() -> None:
    p = pod(containers=[gpu(), container("side"), container("zero", gpu=0)])
    p["spec"]["containers"][1]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "A", "value": "1"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]
    result = admit(p, HIDING)
    assert result.allowed
    side = result.pod["spec"]["containers"][1]["env"]
    assert side == [{"name": "A", "value": "1"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]
    # nvidia.com/gpu: 0 gets no GPU, so it must not see them either
    zero = result.pod["spec"]["containers"][2]["env"]
    assert zero == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]
    assert "env" not in result.pod["spec"]["containers"][0]
    assert jsonpatch.apply_patch(p, result.patch) == result.pod


def test_pods_of_other_schedulers_get_visible_devices_none_too() -> None:
    p = pod(containers=[container("cpu")], schedulerName="volcano")
    p["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    result = admit(p, HIDING)
    assert result.allowed
    assert result.pod["spec"]["containers"][0]["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]
    assert jsonpatch.apply_patch(p, result.patch) == result.pod
    assert admit(p, CONFIG).patch == []  # overwriteEnv off: unchanged, as before


# --- schedulers --------------------------------------------------------------------------

def test_gpu_pod_of_another_scheduler_is_denied_unless_allowed() -> None:
    for limits in ({"gpu": 1}, {"gpumem": 1000}, {"gpucores": 10}):
        attack = pod(containers=[container("main", **limits)], schedulerName="mine",
                     nodeName="n1", hostPID=True)
        assert "schedulerName is 'mine'" in denied(attack)
    allowed = make_config(other_gpu_schedulers=("mine",))
    assert admit(pod(containers=[gpu()], schedulerName="mine"), allowed).allowed
    keep_default = make_config(force_overwrite_default_scheduler=False)
    kept = admit(pod(containers=[gpu()], schedulerName="default-scheduler"), keep_default)
    assert kept.allowed and kept.patch == []


# --- hostile shapes ----------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [("env", "CUDA_DISABLE_CONTROL=true"),
                                              ("env", [1, 2]), ("envFrom", {"a": 1}),
                                              ("volumeMounts", "/etc/ld.so.preload")])
def test_malformed_fields_are_a_message_not_a_crash(field: str, value: Any) -> None:
    attack = pod(containers=[gpu(**{field: value})])
    assert f"container main: {field} is not a list of objects" in filter_refusal(attack)
