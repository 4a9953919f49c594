"""Scheduler metrics values (spec §8): MIG instance info and the legacy names."""

from __future__ import annotations

import json
from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami.api import names
from hami.core.state import ClusterState
from hami.devices.registry import make_config
from hami.scheduler.metrics import SchedulerMetrics

REGISTER = json.dumps([{"id": "GPU-m", "count": 7, "devmem": 40960, "devcore": 100,
                        "type": "NVIDIA-A100", "mode": "mig", "health": True},
                       {"id": "GPU-s", "index": 1, "count": 10, "devmem": 16384,
                        "devcore": 100, "type": "NVIDIA-T4", "health": True}])
MIG = json.dumps([{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-m",
                   "profile": "1g.5gb", "placement": {"start": 6, "size": 1},
                   "migUUID": "MIG-1", "gpuInstanceID": 9, "computeInstanceID": 0}])


def samples(legacy: bool) -> dict[str, list]:
    state = ClusterState(make_config())
    state.upsert_node({"metadata": {"name": "n", "annotations": {names.NODE_REGISTER: REGISTER}}})
    state.upsert_pod({"metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {
        names.VGPU_NODE: "n", names.DEVICES_ALLOCATED: "GPU-m,NVIDIA,4864,15:;",
        names.MIG_ALLOCATIONS: MIG}}, "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"}})
    state.upsert_pod({"metadata": {"name": "q", "namespace": "ns", "uid": "v", "annotations": {
        names.VGPU_NODE: "n", names.DEVICES_ALLOCATED: "GPU-s,NVIDIA,4000,30:;"}},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c"}]}, "status": {"phase": "Running"}})
    metrics = SchedulerMetrics(legacy=legacy)
    metrics.attach(SimpleNamespace(state=state, config=state.config))  # type: ignore[arg-type]
    text = generate_latest(metrics.registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_mig_instance_info_and_allocations():
    got = samples(legacy=False)
    (mig,) = got["hami_node_gpu_mig_instance_info"]
    assert mig.labels == {"node": "n", "device_uuid": "GPU-m", "device_index": "0",
                          "mig_uuid": "MIG-1", "profile": "1g.5gb", "gpu_instance_id": "9",
                          "compute_instance_id": "0", "placement_start": "6",
                          "placement_size": "1", "zone": "vGPU"}
    alloc = {s.labels["device_uuid"]: s.value for s in got["hami_gpu_memory_allocated_bytes"]}
    assert alloc == {"GPU-m": 4864 * 2**20, "GPU-s": 4000 * 2**20}
    assert "GPUDeviceMemoryLimit" not in got


def test_legacy_names_carry_the_same_values():
    got = samples(legacy=True)
    limit = {s.labels["deviceuuid"]: s.value for s in got["GPUDeviceMemoryLimit"]}
    assert limit == {"GPU-m": 40960 * 2**20, "GPU-s": 16384 * 2**20}
    shared = {s.labels["deviceuuid"]: s.value for s in got["GPUDeviceSharedNum"]}
    assert shared == {"GPU-m": 1, "GPU-s": 1}
    (mig,) = got["nodeGPUMigInstance"]
    assert mig.labels["migname"] == "1g.5gb-9"
    vgpu = {s.labels["podname"]: s.value for s in got["vGPUCoreAllocated"]}
    assert vgpu == {"p": 15, "q": 30}


def test_quota_metrics_cover_other_vendors() -> None:
    """``hami_resource_quota_used``/``_limit`` (and legacy ``QuotaUsed``) report every
    vendor's limited resources, not NVIDIA's alone (spec §5.2, §8; found by a breaker)."""
    from hami.devices.registry import build_registry

    state = ClusterState(make_config(registry=build_registry({"nvidia": {}, "hygon": {}})))
    state.upsert_node({"metadata": {"name": "n", "annotations": {
        names.NODE_REGISTER: REGISTER,
        "hami.io/node-dcu-register": "DCU-0,10,65520,100,DCU-Z100,0,true,0,hami-core:"}}})
    state.upsert_quota({"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": {
        "limits.hygon.com/dcumem": "100000", "limits.nvidia.com/gpumem": "100000"}}})
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {}},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {
               "hygon.com/dcunum": 1, "hygon.com/dcumem": 2000,
               "nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}}}]}}
    state.commit(pod, state.filter(pod))
    for legacy in (False, True):
        metrics = SchedulerMetrics(legacy=legacy)
        metrics.attach(SimpleNamespace(state=state, config=state.config))  # type: ignore[arg-type]
        text = generate_latest(metrics.registry).decode()
        fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
        used = {s.labels["quota_name"]: s.value for s in fams["hami_resource_quota_used"]}
        assert used == {"nvidia.com/gpumem": 3000, "hygon.com/dcumem": 2000}
        limits = {s.labels["quota_name"]: s.value for s in fams["hami_resource_quota_limit"]}
        assert limits == {"nvidia.com/gpumem": 100000, "hygon.com/dcumem": 100000}
        if legacy:
            old = {s.labels["quotaName"]: s.value for s in fams["QuotaUsed"]}
            assert old == used


def test_quota_limit_metric_reports_the_tightest_of_several_quotas() -> None:
    """Issue 11 §4: with two ResourceQuotas in a namespace the limit that applies is the
    tightest, for NVIDIA and for other vendors; the metric reports that one."""
    from hami.devices.registry import build_registry

    state = ClusterState(make_config(registry=build_registry({"nvidia": {}, "hygon": {}})))
    for name, value in (("platform", "1000"), ("tenant", "5000")):
        state.upsert_quota({"metadata": {"name": name, "namespace": "team-a"}, "spec": {"hard": {
            "limits.hygon.com/dcumem": value, "limits.nvidia.com/gpumem": value}}})
    metrics = SchedulerMetrics()
    metrics.attach(SimpleNamespace(state=state, config=state.config))  # type: ignore[arg-type]
    text = generate_latest(metrics.registry).decode()
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
    limits = {s.labels["quota_name"]: s.value for s in fams["hami_resource_quota_limit"]}
    assert limits == {"nvidia.com/gpumem": 1000, "hygon.com/dcumem": 1000}
    assert len(fams["hami_resource_quota_limit"]) == 2
