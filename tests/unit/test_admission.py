"""The webhook's decision (spec §3) and field cases B05, B09, B11."""

from __future__ import annotations

from dataclasses import replace

import jsonpatch
import pytest

from hami.core.admission import admit
from hami.core.quota import QuotaLedger
from hami.devices.nvidia import NvidiaConfig, settings
from hami.devices.registry import make_config
from tests.builders import container, pod

CONFIG = make_config()


def limits_of(result, index=0):
    return result.pod["spec"]["containers"][index]["resources"]["limits"]


def test_bare_gpu_gets_exclusive_cores_and_scheduler():
    result = admit(pod(containers=[container(gpu=1)]), CONFIG)
    assert result.allowed
    assert limits_of(result)["nvidia.com/gpucores"] == 100
    assert result.pod["spec"]["schedulerName"] == "hami-scheduler"
    # the patch turns the original into the mutated pod
    assert jsonpatch.apply_patch(pod(containers=[container(gpu=1)]), result.patch) == result.pod


@pytest.mark.parametrize(("limits", "cores"), [
    ({"gpu": 1, "gpumem": 4000}, None),
    ({"gpu": 1, "gpumem_percentage": 100}, 100),
    ({"gpu": 1, "gpumem_percentage": 50}, None),
    ({"gpu": 1, "gpucores": 20}, 20),
])
def test_exclusive_core_default(limits, cores):
    result = admit(pod(containers=[container(**limits)]), CONFIG)
    assert limits_of(result).get("nvidia.com/gpucores") == cores


def test_memory_only_request_gets_default_count():
    result = admit(pod(containers=[container(gpumem=3000)]), CONFIG)
    assert limits_of(result)["nvidia.com/gpu"] == 1
    assert result.pod["spec"]["schedulerName"] == "hami-scheduler"


def test_pod_without_gpu_is_untouched():
    original = pod(containers=[container()])
    result = admit(original, CONFIG)
    assert result.allowed and result.patch == []
    assert "schedulerName" not in result.pod["spec"]


def test_other_scheduler_is_left_alone_only_when_allowed():
    """A GPU pod of another scheduler is refused (HAMi admits it unchecked) unless the
    scheduler is allowed; then it is left alone."""
    denied = admit(pod(containers=[container(gpu=1)], schedulerName="volcano"), CONFIG)
    assert not denied.allowed and "schedulerName is 'volcano'" in denied.message
    allowed = make_config(other_gpu_schedulers=("volcano",))
    result = admit(pod(containers=[container(gpu=1)], schedulerName="volcano"), allowed)
    assert result.allowed and result.patch == []
    plain = admit(pod(containers=[container()], schedulerName="volcano"), CONFIG)
    assert plain.allowed and plain.patch == []


def test_default_scheduler_is_overwritten():
    result = admit(pod(containers=[container(gpu=1)], schedulerName="default-scheduler"), CONFIG)
    assert result.pod["spec"]["schedulerName"] == "hami-scheduler"


def test_envs_and_runtime_class():
    config = make_config(nvidia=NvidiaConfig(gpu_core_policy="force",
                                                 runtime_class_name="nvidia",
                                                 overwrite_env=True))
    p = pod(containers=[container("g", gpu=1, priority=1), container("cpu")])
    result = admit(p, config)
    env_g = {e["name"]: e["value"] for e in result.pod["spec"]["containers"][0]["env"]}
    env_cpu = {e["name"]: e["value"] for e in result.pod["spec"]["containers"][1]["env"]}
    assert env_g == {"CUDA_TASK_PRIORITY": "1", "GPU_CORE_UTILIZATION_POLICY": "force"}
    assert env_cpu["NVIDIA_VISIBLE_DEVICES"] == "none"
    assert result.pod["spec"]["runtimeClassName"] == "nvidia"


def test_isolation_settings_are_the_nvidia_backends():
    # The webhook and the isolation rules read overwriteEnv, runtimeClassName, the
    # priority resource and gpuCorePolicy from the registry's NVIDIA backend
    # (Vendor.env_isolation), not from a copy of its settings beside the registry.
    from hami.core import isolation
    from hami.devices.nvidia import Nvidia
    from hami.devices.registry import Registry

    settings = NvidiaConfig(gpu_core_policy="force", runtime_class_name="nvidia",
                            overwrite_env=True, resource_count_name="hami.io/gpu")
    config = replace(CONFIG, registry=Registry({"NVIDIA": Nvidia(settings)}))
    p = pod(containers=[container("cpu")])
    p["spec"]["containers"].append({"name": "g", "resources": {"limits": {"hami.io/gpu": 1}}})
    result = admit(p, config)
    env_cpu = {e["name"]: e["value"] for e in result.pod["spec"]["containers"][0]["env"]}
    env_g = {e["name"]: e["value"] for e in result.pod["spec"]["containers"][1]["env"]}
    assert env_cpu["NVIDIA_VISIBLE_DEVICES"] == "none"
    assert env_g == {"GPU_CORE_UTILIZATION_POLICY": "force"}
    assert result.pod["spec"]["runtimeClassName"] == "nvidia"
    assert isolation.asks_for_devices(p, config)
    assert not isolation.violations(result.pod, config)


def test_node_name_is_denied():
    result = admit(pod(containers=[container(gpu=1)], nodeName="n1"), CONFIG)
    assert not result.allowed and result.message == "pod has node assigned"


def test_no_containers_denied():
    p = pod()
    p["spec"]["containers"] = []
    assert admit(p, CONFIG).message == "pod has no containers"


@pytest.mark.parametrize("bad", ["not a pod", {"spec": "x"}])
def test_garbage_is_a_400(bad):
    result = admit(bad, CONFIG)
    assert not result.allowed and result.code == 400


@pytest.mark.parametrize(("name", "percent"), [("pct-150", 150), ("pct-101", 101),
                                             ("pct-wrap", 2**32 + 50)])
def test_b09_out_of_range_percentages_denied_with_range(name, percent):
    """B09: memory shares outside 0-100 (101, above 100, past 32 bits) are denied, naming the range."""
    result = admit(pod(name, [container(gpu=1, gpumem_percentage=percent)]), CONFIG)
    assert not result.allowed, name
    assert "between 0 and 100" in result.message
    assert "nvidia.com/gpumem-percentage" in result.message


def test_b09_no_memory_and_no_percentage_is_admitted():
    """B09 (control): a card with neither memory nor share set is a valid whole-card request."""
    assert admit(pod("no-mem", [container(gpu=1)]), CONFIG).allowed


@pytest.mark.parametrize("limits", [{"gpu": 1, "gpucores": 101}, {"gpu": 1, "gpumem": -1},
                                    {"gpu": 1, "gpumem": "16Gi"}])
def test_other_bad_values_denied(limits):
    result = admit(pod(containers=[container("w", **limits)]), CONFIG)
    assert not result.allowed and result.code == 403 and "w" in result.message


def test_b11_privileged_gpu_container_denied():
    """B11: a privileged container in a pod asking for cards is denied, not silently skipped."""
    priv = pod("priv", [container(privileged=True, gpu=2, gpumem=10240)])
    denied = admit(priv, CONFIG)
    assert not denied.allowed and denied.message == "container c is privileged"
    untouched = admit(pod("priv-no-gpu", [container(privileged=True)]), CONFIG)
    assert untouched.allowed and untouched.patch == []
    priv_init = pod("priv-init", [container(gpu=1, gpumem=1000)], [container("i", privileged=True)])
    init = admit(priv_init, CONFIG)
    assert not init.allowed and init.message == "container i is privileged"
    assert init.patch == []  # nothing half-mutated


def test_b05_init_only_gpu_pod_is_routed_and_quota_checked():
    """B05: a pod asking for a card only in an init container is routed to us and quota-checked."""
    def prep():
        return pod("prep", [container("main")], [container("warmup", gpu=1, gpumem=8000)],
                   namespace="ns1")

    routed = admit(prep(), CONFIG)
    assert routed.allowed and routed.pod["spec"]["schedulerName"] == "hami-scheduler"
    quota = QuotaLedger()
    quota.set_quota("ns1", "q", {"limits.nvidia.com/gpumem": 4000})
    denied = admit(prep(), CONFIG, quota)
    assert not denied.allowed and "exceeding resource quota" in denied.message


def test_quota_precheck_takes_max_of_app_sum_and_init_peak():
    quota = QuotaLedger()
    quota.set_quota("ns", "q", {"limits.nvidia.com/gpumem": "5000"})
    fits = pod(containers=[container("a", gpu=1, gpumem=2000), container("b", gpu=1, gpumem=2000)],
               init=[container("i", gpu=1, gpumem=5000), container("j", gpu=1, gpumem=4000)],
               namespace="ns")
    assert admit(fits, CONFIG, quota).allowed
    too_much = pod(containers=[container("a", gpu=2, gpumem=3000)], namespace="ns")
    assert not admit(too_much, CONFIG, quota).allowed


def test_container_without_resources_gets_no_empty_patch():
    p = pod(containers=[container(gpu=1)])
    p["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})
    result = admit(p, CONFIG)
    assert all("/containers/1" not in op["path"] for op in result.patch)
    assert "resources" not in result.pod["spec"]["containers"][1]


GPU_POLICY = "hami.io/gpu-scheduler-policy"
NODE_POLICY = "hami.io/node-scheduler-policy"
GPU_VALID = ("valid values: spread, binpack, topology-aware, mutex, fragmentation-aware, numa, "
             "or a comma list of them (e.g. numa,binpack)")
NODE_VALID = "valid values: binpack, spread, fragmentation-aware"


@pytest.mark.parametrize(("key", "value", "valid"), [
    (GPU_POLICY, "bogus", GPU_VALID),
    (GPU_POLICY, "binpack,bogus", GPU_VALID),
    (GPU_POLICY, "binpack,", GPU_VALID),
    (NODE_POLICY, "bogus", NODE_VALID),
    (NODE_POLICY, "binpack,spread", NODE_VALID),
])
def test_unknown_policy_annotation_denied_with_the_valid_values(key, value, valid):
    """Issue 11 item 5: HAMi admits any value and then places with its fallback policy."""
    result = admit(pod("pol", [container(gpu=1, gpumem=1000)], annotations={key: value}), CONFIG)
    assert not result.allowed and result.code == 403
    assert result.message == f"unknown {key} value {value!r}; {valid}"
    assert result.patch == []


def test_both_unknown_policies_named_in_one_denial_known_ones_admitted():
    result = admit(pod("pol", [container(gpu=1)], annotations={
        GPU_POLICY: "fast", NODE_POLICY: "Spread"}), CONFIG)
    assert not result.allowed
    assert result.message == (f"unknown {NODE_POLICY} value 'Spread'; {NODE_VALID}; "
                              f"unknown {GPU_POLICY} value 'fast'; {GPU_VALID}")
    for known in ({GPU_POLICY: "topology-aware", NODE_POLICY: "spread"},
                  {GPU_POLICY: "numa,binpack"}, {GPU_POLICY: "binpack, numa"},
                  {GPU_POLICY: "numa"}, {GPU_POLICY: "mutex"},
                  {GPU_POLICY: "fragmentation-aware", NODE_POLICY: "fragmentation-aware"},
                  {GPU_POLICY: "", NODE_POLICY: "  "}):  # empty: not set
        assert admit(pod("pol", [container(gpu=1)], annotations=known), CONFIG).allowed, known
    # a pod that asks for no device is not placed by hami: its annotations are not judged
    cpu = admit(pod("cpu", [container()], annotations={GPU_POLICY: "bogus"}), CONFIG)
    assert cpu.allowed and cpu.patch == []


FORGED = {"hami.io/vgpu-node": "gpu-1", "hami.io/vgpu-devices-to-allocate": "GPU-0,NVIDIA,81920,100:;",
          "hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,81920,100:;",
          "hami.io/bind-phase": "allocating", "hami.io/bind-time": "1700000000",
          "hami.io/dcu-devices-allocated": "DCU-0,DCU,1000,10:;", "team": "kept"}


@pytest.mark.parametrize("scheduler", [None, "hami-scheduler", "default-scheduler", "other"])
def test_allocation_annotations_written_by_the_pod_creator_are_removed(scheduler):
    # Field report: a pod of another scheduler created with a self-written allocation was
    # served it by the device plugin. Whatever the scheduler, the webhook removes hami's
    # allocation annotations and label; other annotations stay.
    original = pod(containers=[container()], annotations=dict(FORGED))
    original["metadata"]["labels"] = {"hami.io/vgpu-node": "gpu-1", "app": "x"}
    if scheduler:
        original["spec"]["schedulerName"] = scheduler
    result = admit(original, CONFIG)
    assert result.allowed
    patched = jsonpatch.apply_patch(original, result.patch)
    assert patched["metadata"]["annotations"] == {  # DCU is not a registered vendor here
        "team": "kept", "hami.io/dcu-devices-allocated": FORGED["hami.io/dcu-devices-allocated"]}
    assert patched["metadata"]["labels"] == {"app": "x"}
    assert "removed annotation hami.io/bind-phase" in result.message


def test_registered_vendors_allocation_annotations_are_removed_too():
    from tests.unit.test_vendor_dispatch import REGISTRY

    original = pod(containers=[container(gpu=1)], annotations=dict(FORGED))
    result = admit(original, make_config(registry=REGISTRY))
    patched = jsonpatch.apply_patch(original, result.patch)
    assert patched["metadata"]["annotations"] == {"team": "kept"}
    assert patched["spec"]["schedulerName"] == "hami-scheduler"


def test_added_ephemeral_containers_are_hidden_from_gpus_through_the_review():
    import base64
    import json
    from dataclasses import replace

    from hami.webhook.review import review

    config = make_config(nvidia=replace(settings(CONFIG), overwrite_env=True))
    old = pod(containers=[container()])
    old["spec"]["ephemeralContainers"] = [{"name": "first", "image": "x"}]
    new = json.loads(json.dumps(old))
    new["spec"]["ephemeralContainers"].append(
        {"name": "debugger", "image": "cuda",
         "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]})

    def ask(sub_resource, operation, cfg=config):
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u", "kind": {"kind": "Pod"}, "subResource": sub_resource,
                            "operation": operation, "object": new, "oldObject": old}}
        return review(json.dumps(body).encode(), cfg, None)["response"]

    response = ask("ephemeralcontainers", "UPDATE")
    patched = jsonpatch.apply_patch(new, json.loads(base64.b64decode(response["patch"])))
    first, added = patched["spec"]["ephemeralContainers"]
    assert first == {"name": "first", "image": "x"}  # existing ones are immutable
    assert added["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]
    assert "patch" not in ask("ephemeralcontainers", "UPDATE", CONFIG)  # overwriteEnv off
    for other in (("", "UPDATE"), ("status", "UPDATE"), ("", "DELETE")):
        assert ask(*other)["allowed"] and "patch" not in ask(*other)


def test_ephemeral_container_cannot_bring_privilege_into_a_gpu_pod():
    from hami.core.admission import admit_ephemeral

    def debug(**ctx):
        return {"name": "dbg", "image": "x", "securityContext": ctx}

    gpu = pod(containers=[container(gpu=1, gpumem=1000)])
    for ctx, why in (({"privileged": True}, "is privileged"),
                     ({"capabilities": {"add": ["SYS_ADMIN"]}}, "SYS_ADMIN is not allowed"),
                     ({"capabilities": {"add": ["cap_dac_read_search"]}}, "not allowed")):
        new = {**gpu, "spec": {**gpu["spec"], "ephemeralContainers": [debug(**ctx)]}}
        result = admit_ephemeral(new, gpu, CONFIG)
        assert not result.allowed and result.code == 403 and why in result.message, result
    # a harmless debug container, and any container on a pod without GPUs, pass
    plain = pod(containers=[container()])
    ok = {**gpu, "spec": {**gpu["spec"], "ephemeralContainers": [debug(runAsUser=1000)]}}
    assert admit_ephemeral(ok, gpu, CONFIG).allowed
    other = {**plain, "spec": {**plain["spec"],
                               "ephemeralContainers": [debug(privileged=True)]}}
    assert admit_ephemeral(other, plain, CONFIG).allowed
    # an ephemeral container that already existed is not judged again
    assert admit_ephemeral(other | {"spec": {**gpu["spec"], "ephemeralContainers": [
        debug(privileged=True)]}}, {**gpu, "spec": {**gpu["spec"], "ephemeralContainers": [
            debug(privileged=True)]}}, CONFIG).allowed
