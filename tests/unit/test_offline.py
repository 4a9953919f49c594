"""``hami schedule``: the offline scheduler over Kubernetes objects (issue 2 §3)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from hami.cli import app
from hami.devices.registry import make_config
from hami.offline import SCHEMA, InputError, load_objects, schedule

REGISTER = json.dumps([
    {"id": "GPU-a0", "count": 10, "devmem": 16384, "devcore": 100, "type": "NVIDIA-Tesla T4",
     "health": True},
    {"id": "GPU-a1", "index": 1, "count": 10, "devmem": 16384, "devcore": 100,
     "type": "NVIDIA-Tesla T4", "health": True},
], separators=(",", ":"))


def node(name, register=REGISTER):
    ann = {} if register is None else {"hami.io/node-nvidia-register": register}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": ann}}


def gpu_pod(name, mem, node_name=None, allocated=None, **extra):
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": name, "namespace": "team", "annotations": {}},
         "spec": {"containers": [{"name": "c", "resources": {"limits": {
             "nvidia.com/gpu": 1, "nvidia.com/gpumem": mem, **extra}}}]}}
    if node_name:
        p["spec"]["nodeName"] = node_name
        p["spec"]["schedulerName"] = "hami-scheduler"
        p["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = allocated
    return p


CLUSTER = [
    node("gpu-1"),
    node("gpu-2"),
    node("broken", register="{not json"),
    gpu_pod("running", 16000, "gpu-1", "GPU-a1,NVIDIA,16000,0:;"),
    gpu_pod("first", 4000),
    gpu_pod("second", 16384),
    gpu_pod("too-big", 20000),
    gpu_pod("bad-pct", 1, **{"nvidia.com/gpumem-percentage": 150}),
]


def test_schedule_sees_existing_usage_and_earlier_decisions():
    report = schedule(CLUSTER)
    assert report["schema"] == SCHEMA
    assert report["nodes"]["gpu-1"] == "" and "not valid JSON" in report["nodes"]["broken"]
    pods = {p["name"]: p for p in report["pods"]}
    first = pods["first"]
    assert first["admission"]["allowed"] and first["node"] == "gpu-1"  # binpack: used node
    assert first["annotations"] == {
        "hami.io/vgpu-node": "gpu-1",
        "hami.io/vgpu-devices-to-allocate": "GPU-a0,NVIDIA,4000,0:;",
        "hami.io/vgpu-devices-allocated": "GPU-a0,NVIDIA,4000,0:;"}
    # gpu-1 has 12384 + 384 free now; a whole card must go to gpu-2
    assert pods["second"]["node"] == "gpu-2"
    too_big = pods["too-big"]
    assert too_big["node"] is None and too_big["annotations"] == {}
    assert too_big["failed_nodes"]["gpu-1"] == "2/2 CardInsufficientMemory"
    assert too_big["failed_nodes"]["broken"] == "node unregistered"
    assert not pods["bad-pct"]["admission"]["allowed"]
    assert "between 0 and 100" in pods["bad-pct"]["admission"]["message"]


def test_list_kind_and_json_stream_are_accepted():
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": CLUSTER[:2] + [CLUSTER[4]]})
    assert [o["kind"] for o in load_objects(text)] == ["Node", "Node", "Pod"]
    with pytest.raises(InputError):
        load_objects("- just\n- a list\n")


def test_cli_json_and_table(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(CLUSTER))
    runner = CliRunner()
    result = runner.invoke(app, ["schedule", "-f", str(path), "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == schedule(CLUSTER)
    table = runner.invoke(app, ["schedule", "-f", str(path), "--gpu-policy", "binpack"])
    assert table.exit_code == 0 and "team/first" in table.output
    missing = runner.invoke(app, ["schedule", "-f", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2


def test_device_config_renames_resources(tmp_path):
    config = tmp_path / "device-config.yaml"
    config.write_text("nvidia:\n  resourceCountName: hami.io/gpu\n  defaultMemory: 1000\n")
    path = tmp_path / "c.yaml"
    renamed = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "r", "namespace": "x"},
               "spec": {"containers": [{"name": "c", "resources": {"limits": {"hami.io/gpu": 1}}}]}}
    path.write_text(yaml.safe_dump_all([node("gpu-1"), renamed]))
    result = CliRunner().invoke(app, ["schedule", "-f", str(path), "--device-config", str(config),
                                      "-o", "json"])
    assert result.exit_code == 0, result.output
    pod = json.loads(result.output)["pods"][0]
    assert pod["annotations"]["hami.io/vgpu-devices-allocated"].endswith(",NVIDIA,1000,100:;")  # exclusive: no gpumem given


def test_cli_refuses_unknown_policies_and_explains_unregistered_nodes(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(CLUSTER))
    runner = CliRunner()
    for flag, value in (("--node-policy", "foo"), ("--node-policy", "Spread"),
                        ("--gpu-policy", "bogus")):
        result = runner.invoke(app, ["schedule", "-f", str(path), flag, value])
        assert result.exit_code == 2 and value in result.output
    table = runner.invoke(app, ["schedule", "-f", str(path)])
    assert "node broken not registered" in table.output


def test_gpumem_with_a_unit_says_what_is_expected():
    from hami.core.request import RequestError
    from hami.devices.nvidia import NvidiaConfig, container_request

    c = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "16Gi"}}}
    with pytest.raises(RequestError, match="counts MiB, e.g. 16384 for 16 GiB"):
        container_request(c, NvidiaConfig())
    ok = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "3k"}}}
    assert container_request(ok, NvidiaConfig()).memory_mib == 3000  # an exact integer quantity


MIG_NODE = json.dumps([{"id": "GPU-mig", "count": 7, "devmem": 40960, "devcore": 100,
                        "type": "NVIDIA-A100-SXM4-40GB", "mode": "mig",
                        "migProfiles": [
                            {"name": "1g.5gb", "memoryMB": 4864, "core": 15, "sliceCount": 1,
                             "placements": [{"start": s, "size": 1} for s in range(7)]},
                            {"name": "3g.20gb", "memoryMB": 19968, "core": 43, "sliceCount": 3,
                             "placements": [{"start": 0, "size": 4}, {"start": 4, "size": 4}]}],
                        "health": True}], separators=(",", ":"))


def test_schedule_places_mig_instances_and_writes_their_annotation():
    report = schedule([node("mig-1", MIG_NODE), gpu_pod("small", 3000), gpu_pod("mid", 12000),
                       gpu_pod("full", 12000)])
    pods = {p["name"]: p for p in report["pods"]}
    small = json.loads(pods["small"]["annotations"]["hami.io/vgpu-mig-allocations"])
    assert small[0]["profile"] == "1g.5gb" and small[0]["placement"] == {"start": 6, "size": 1}
    assert pods["small"]["annotations"]["hami.io/vgpu-devices-allocated"] == \
        "GPU-mig,NVIDIA,4864,15:;"
    # 3g prefers the highest start, but [4, 8) overlaps the 1g instance at 6: it takes [0, 4)
    mid = json.loads(pods["mid"]["annotations"]["hami.io/vgpu-mig-allocations"])
    assert (mid[0]["profile"], mid[0]["placement"]) == ("3g.20gb", {"start": 0, "size": 4})
    assert pods["full"]["node"] is None
    assert "CardMigTopologyInfeasible" in pods["full"]["failed_nodes"]["mig-1"]


# ---------------------------------------------------------------- malformed files
_GARBAGE = [None, "x", 1, [], {}, [1], [None], {"a": 1}, True, 1.5]
_NODE = {"kind": "Node", "metadata": {"name": "n1", "annotations": {
    "hami.io/node-nvidia-register": '[{"id":"GPU-0","index":0,"count":10,"devmem":16384,'
                                    '"devcore":100,"type":"NVIDIA-T4","health":true}]'}}}


def _pod_variants():
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "hygon.com/dcunum": 1}

    def pod(meta=None, spec=None, status=None):
        out = {"kind": "Pod", "metadata": meta if meta is not None else {"name": "p"},
               "spec": spec if spec is not None else
               {"containers": [{"name": "c", "resources": {"limits": limits}}]}}
        if status is not None:
            out["status"] = status
        return out
    for v in _GARBAGE:
        yield pod(meta=v)
        yield pod(meta={"name": "p", "annotations": v})
        yield pod(meta={"name": "p", "annotations": {"hami.io/gpu-scheduler-policy": v}})
        yield pod(spec=v)
        yield pod(spec={"containers": v})
        yield pod(spec={"containers": [v]})
        yield pod(spec={"initContainers": v, "containers": []})
        yield pod(spec={"containers": [{"name": v, "resources": {"limits": limits}}]})
        yield pod(spec={"containers": [{"name": "c", "resources": v}]})
        yield pod(spec={"containers": [{"name": "c", "resources": {"limits": v}}]})
        yield pod(spec={"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": v}}}]})
        yield pod(status=v)
        yield pod(status={"initContainerStatuses": v})


@pytest.mark.parametrize("bad", list(_pod_variants()))
def test_malformed_objects_are_a_clear_error_never_a_crash(bad: dict[str, Any]) -> None:
    """A hand-written file with a field of the wrong type (an empty YAML value is null,
    an unquoted number is an int) is refused with the field's path, or scheduled if the
    value is still meaningful; no other exception escapes (found by a breaker)."""
    from hami.devices.registry import build_registry

    text = yaml.safe_dump_all([_NODE, bad])
    try:
        objects = load_objects(text)
    except InputError as exc:
        assert "must be" in str(exc)
        return
    config = make_config(registry=build_registry({"nvidia": {}, "hygon": {}}))
    report = schedule(objects, config)
    assert report["nodes"] == {"n1": ""}


# ---------------------------------------------------------------- issue 11 regressions
TOPOLOGY_FILE = """
apiVersion: v1
kind: Node
metadata:
  name: node-1
  annotations:
    hami.io/node-nvidia-register: '[{"id":"dev-0","index":0,"count":10,"devmem":8192,"devcore":100,"type":"NVIDIA","health":true},{"id":"dev-1","index":1,"count":10,"devmem":8192,"devcore":100,"type":"NVIDIA","health":true},{"id":"dev-2","index":2,"count":10,"devmem":8192,"devcore":100,"type":"NVIDIA","health":true}]'
    hami.io/node-nvidia-score: '[{"uuid":"dev-0","score":{"dev-1":-5,"dev-2":-3}},{"uuid":"dev-1","score":{"dev-0":-5,"dev-2":-1}},{"uuid":"dev-2","score":{"dev-0":-3,"dev-1":-1}}]'
---
apiVersion: v1
kind: Pod
metadata: {name: topo2, namespace: default, annotations: {hami.io/gpu-scheduler-policy: topology-aware}}
spec:
  containers:
  - name: c0
    image: x
    resources: {limits: {nvidia.com/gpu: 2, nvidia.com/gpumem: 100, nvidia.com/gpucores: 10}}
"""


def test_topology_aware_with_negative_pair_scores_places_the_best_pair():
    pod = schedule(load_objects(TOPOLOGY_FILE))["pods"][0]
    assert pod["node"] == "node-1"
    assert pod["annotations"]["hami.io/vgpu-devices-allocated"] == \
        "dev-2,NVIDIA,100,10:dev-1,NVIDIA,100,10:;"


def test_pod_of_another_scheduler_is_reported_and_never_charged():
    other = gpu_pod("other", 16000)
    other["spec"]["schedulerName"] = "other"
    config = make_config(other_gpu_schedulers=("other",))
    report = schedule([node("gpu-1"), other, gpu_pod("a", 16000), gpu_pod("b", 16000)], config)
    pods = {p["name"]: p for p in report["pods"]}
    assert pods["other"]["admission"]["message"] == "pod already has different scheduler assigned"
    assert pods["other"]["node"] is None and pods["other"]["annotations"] == {}
    assert "not scheduled by hami" in pods["other"]["error"]
    # the two cards are still free for the two hami pods that follow
    assert pods["a"]["node"] == pods["b"]["node"] == "gpu-1"


def test_terminating_pod_in_the_file_still_holds_its_card():
    register = json.dumps([{"id": "GPU-0", "count": 10, "devmem": 24576, "devcore": 100,
                            "type": "NVIDIA-A10", "health": True}])
    old = gpu_pod("old", 20000, "gpu-1", "GPU-0,NVIDIA,20000,0:;")
    old["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    old["status"] = {"phase": "Running"}
    pod = schedule([node("gpu-1", register), old, gpu_pod("new", 10000)])["pods"][0]
    assert pod["node"] is None
    assert "CardInsufficientMemory" in pod["failed_nodes"]["gpu-1"]


def quota(name, hard, namespace="team"):
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"hard": hard}}


def test_several_quotas_in_a_namespace_all_apply():
    """Issue 11 §4: with quotas ``platform`` (1000 MiB) and ``tenant`` (5000 MiB) in the file,
    in either order, a 3000 MiB pod is refused and a 1000 MiB one placed; then the
    namespace is full."""
    quotas = [quota("platform", {"limits.nvidia.com/gpumem": "1000"}),
              quota("tenant", {"limits.nvidia.com/gpumem": "5000"})]
    for ordered in (quotas, quotas[::-1]):
        report = schedule([node("gpu-1"), *ordered, gpu_pod("big", 3000), gpu_pod("fits", 1000),
                           gpu_pod("one-more", 1)])
        pods = {p["name"]: p for p in report["pods"]}
        assert not pods["big"]["admission"]["allowed"], ordered
        assert pods["big"]["admission"]["message"].startswith("exceeding resource quota")
        assert pods["fits"]["node"] == "gpu-1"
        assert not pods["one-more"]["admission"]["allowed"]  # 1000 MiB of 1000 are used


def test_unknown_policy_annotation_is_denied_at_admission():
    """Issue 11 item 5: admission denies an unknown policy annotation with the valid values
    (the filter's fallback for a bypassed webhook is tested in test_filter.py and on the
    live server)."""
    pod = gpu_pod("denied", 1000)
    pod["metadata"]["annotations"]["hami.io/gpu-scheduler-policy"] = "bogus"
    report = schedule([node("gpu-1"), pod])
    denied = report["pods"][0]
    assert not denied["admission"]["allowed"] and denied["node"] is None
    assert denied["annotations"] == {}
    assert denied["admission"]["message"].startswith(
        "unknown hami.io/gpu-scheduler-policy value 'bogus'; valid values: spread, binpack")
