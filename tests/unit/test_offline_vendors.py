"""``hami schedule`` with a mixed-vendor cluster (issue 7 §3): NVIDIA, Hygon DCU (legacy
register), Ascend 910B3 (JSON register, templates), Cambricon (capacity) and a pod with
an NVIDIA container and a DCU container. Runs the CLI on the example manifests in
``docs/examples/mixed-vendor`` and checks every annotation the scheduler writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hami.cli import app
from hami.offline import load_objects, schedule
from hami.settings import scheduler_config

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "mixed-vendor"
CLUSTER = EXAMPLE / "cluster.yaml"
DEVICE_CONFIG = EXAMPLE / "device-config.yaml"


def run(*extra: str, cluster: Path = CLUSTER) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["schedule", "-f", str(cluster), "-o", "json", *extra])
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.output)
    return report


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return run("--device-config", str(DEVICE_CONFIG), "--enable-ascend")


def pods(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in report["pods"]}


def test_every_vendor_node_registers(report: dict[str, Any]) -> None:
    assert report["nodes"] == {"gpu-1": "", "dcu-1": "", "mixed-1": "", "npu-1": "",
                               "mlu-1": ""}


def test_nvidia_pod_is_unchanged(report: dict[str, Any]) -> None:
    p = pods(report)["cuda-train"]
    assert p["node"] == "gpu-1"
    assert p["annotations"] == {
        "hami.io/vgpu-node": "gpu-1",
        "hami.io/vgpu-devices-to-allocate": "GPU-a100-1,NVIDIA,8000,0:;",
        "hami.io/vgpu-devices-allocated": "GPU-a100-1,NVIDIA,8000,0:;"}


def test_dcu_pod_sees_existing_dcu_usage(report: dict[str, Any]) -> None:
    # binpack: dcu-1 already runs dcu-running (read from its allocated annotation), so it
    # outscores the empty DCU of mixed-1; GPU spread then takes the unused card.
    p = pods(report)["dcu-infer"]
    assert p["node"] == "dcu-1"
    assert p["annotations"] == {
        "hami.io/vgpu-node": "dcu-1",
        "hami.io/dcu-devices-to-allocate": "DCU-z100-1,DCU,4000,30:;",
        "hami.io/dcu-devices-allocated": "DCU-z100-1,DCU,4000,30:;"}


def test_ascend_pod_gets_a_template_and_runtime_annotation(report: dict[str, Any]) -> None:
    p = pods(report)["npu-job"]
    assert p["node"] == "npu-1"
    ann = p["annotations"]
    # 20000 MiB rounds up to vir10_3c_32g: 32768 MiB and 10/20 AI cores = 50 %
    assert ann["hami.io/Ascend910B3-devices-allocated"] == "NPU-910b3-1,Ascend910B3,32768,50:;"
    assert ann["hami.io/Ascend910B3-devices-to-allocate"] == ann[
        "hami.io/Ascend910B3-devices-allocated"]
    assert json.loads(ann["huawei.com/Ascend910B3"]) == [{"UUID": "NPU-910b3-1",
                                                          "temp": "vir10_3c_32g"}]
    assert ann["predicate-time"].isdigit() and int(ann["predicate-time"]) > 10**18
    assert "hami.io/vgpu-devices-allocated" not in ann


def test_cambricon_pod_on_capacity_devices(report: dict[str, Any]) -> None:
    p = pods(report)["mlu-job"]
    assert p["node"] == "mlu-1"
    assert p["annotations"] == {
        "hami.io/vgpu-node": "mlu-1",
        "hami.io/cambricon-mlu-devices-to-allocate": "mlu-1-cambricon-mlu-1,MLU,2048,50:;",
        "hami.io/cambricon-mlu-devices-allocated": "mlu-1-cambricon-mlu-1,MLU,2048,50:;",
        "CAMBRICON_DSMLU_PROFILE": "1_50_8",
        "CAMBRICON_DSMLU_ASSIGNED": "false"}


def test_nvidia_and_dcu_containers_land_together_with_positional_strings(
        report: dict[str, Any]) -> None:
    p = pods(report)["cuda-and-dcu"]
    assert p["node"] == "mixed-1"  # the only node with both vendors
    assert p["annotations"] == {
        "hami.io/vgpu-node": "mixed-1",
        # container 0 holds the GPU, container 1 nothing: "...:;" + ";"
        "hami.io/vgpu-devices-to-allocate": "GPU-t4-0,NVIDIA,4000,0:;;",
        "hami.io/vgpu-devices-allocated": "GPU-t4-0,NVIDIA,4000,0:;;",
        # container 0 nothing, container 1 the DCU
        "hami.io/dcu-devices-to-allocate": ";DCU-mixed-0,DCU,2000,0:;",
        "hami.io/dcu-devices-allocated": ";DCU-mixed-0,DCU,2000,0:;"}


def test_unschedulable_reasons_are_the_vendors(report: dict[str, Any]) -> None:
    dcu = pods(report)["dcu-too-big"]
    assert dcu["node"] is None and dcu["annotations"] == {}
    assert dcu["failed_nodes"] == {"dcu-1": "2/2 CardInsufficientMemory",
                                   "gpu-1": "NodeInsufficientDevice",
                                   "mixed-1": "1/1 CardInsufficientMemory",
                                   "mlu-1": "NodeInsufficientDevice",
                                   "npu-1": "NodeInsufficientDevice"}
    mlu = pods(report)["mlu-too-big"]
    assert mlu["failed_nodes"]["mlu-1"] == "2/2 CardInsufficientMemory"


def test_vendor_webhook_denies_with_its_message(report: dict[str, Any]) -> None:
    p = pods(report)["mlu-bad-cores"]
    assert p["admission"]["allowed"] is False
    assert p["admission"]["message"] == ("invalid cambricon.com/mlu.smlu.vcore value 150 in "
                                         "container bad: must be 0..100")
    assert p["node"] is None


def test_ascend_needs_its_flag() -> None:
    out = run("--device-config", str(DEVICE_CONFIG))
    assert out["nodes"]["npu-1"] != ""  # no Ascend vendor: nothing registered there
    npu = pods(out)["npu-job"]
    assert npu["node"] is None and "requests no device" in npu["error"]
    assert pods(out)["cuda-and-dcu"]["node"] == "mixed-1"


def test_without_device_config_only_nvidia_is_known() -> None:
    out = run()
    assert out["nodes"]["dcu-1"] == "annos not found hami.io/node-nvidia-register"
    assert out["nodes"]["mixed-1"] == ""
    assert pods(out)["dcu-infer"]["error"] == (
        "pod requests no device of NVIDIA; left to kube-scheduler"
        " (other vendors need --device-config-file with their sections)")
    mixed = pods(out)["cuda-and-dcu"]  # the DCU container is not HAMi's business then
    assert mixed["node"] == "gpu-1"  # binpack: the node cuda-train already uses
    assert mixed["annotations"]["hami.io/vgpu-devices-allocated"] == "GPU-a100-0,NVIDIA,4000,0:;;"
    assert not any("dcu" in k for k in mixed["annotations"])


def test_table_output_lists_every_vendor_allocation() -> None:
    result = CliRunner(env={"COLUMNS": "400"}).invoke(
        app, ["schedule", "-f", str(CLUSTER), "--device-config", str(DEVICE_CONFIG),
              "--enable-ascend"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = next(i for i, line in enumerate(lines) if "team/cuda-and-dcu" in line)
    # one annotation per line of the cell (";" already separates containers inside one)
    assert "vgpu-devices-allocated=GPU-t4-0,NVIDIA,4000,0:;;" in lines[start]
    assert "dcu-devices-allocated=;DCU-mixed-0,DCU,2000,0:;" in lines[start + 1]


# ------------------------------------------------------------------- quota per vendor
def _dcu_pod(name: str, limits: dict[str, Any], namespace: str = "q") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def test_vendor_quota_admission_and_fit_time() -> None:
    objects = [o for o in load_objects(CLUSTER.read_text()) if o["kind"] == "Node"]
    objects += [
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "q"},
         "spec": {"hard": {"limits.hygon.com/dcumem": "6000"}}},
        _dcu_pod("first", {"hygon.com/dcunum": 1, "hygon.com/dcumem": 4000}),
        _dcu_pod("second", {"hygon.com/dcunum": 1, "hygon.com/dcumem": 4000}),
        # no memory given: the whole card (65520 MiB) is booked at fit time only
        _dcu_pod("whole", {"hygon.com/dcunum": 1}),
        _dcu_pod("other-ns", {"hygon.com/dcunum": 1, "hygon.com/dcumem": 4000}, "free"),
    ]
    out = pods(schedule(objects, scheduler_config(DEVICE_CONFIG)))
    assert out["first"]["node"] is not None
    assert out["second"]["admission"]["allowed"] is False
    assert out["second"]["admission"]["message"].startswith("exceeding resource quota")
    assert out["whole"]["node"] is None
    assert set(out["whole"]["failed_nodes"].values()) >= {"1/1 ResourceQuotaNotFit"}
    assert out["other-ns"]["node"] is not None


def test_malformed_vendor_annotation_is_reported_not_silent(tmp_path: Path) -> None:
    """A node whose DCU register annotation does not decode still serves its NVIDIA GPUs;
    the report says which devices were skipped and why (found by a new-user trial)."""
    import yaml

    docs = list(yaml.safe_load_all(CLUSTER.read_text()))
    mixed = next(d for d in docs if d and d["kind"] == "Node"
                 and d["metadata"]["name"] == "mixed-1")
    mixed["metadata"]["annotations"]["hami.io/node-dcu-register"] = "DCU-a-0,four,bad"
    broken = tmp_path / "cluster.yaml"
    broken.write_text(yaml.safe_dump_all([d for d in docs if d]))
    out = run("--device-config", str(DEVICE_CONFIG), "--enable-ascend", cluster=broken)
    assert out["nodes"]["mixed-1"] == ""
    assert "mixed-1" in out["node_warnings"] and "DCU" in out["node_warnings"]["mixed-1"]
    assert set(out["node_warnings"]) == {"mixed-1"}
    table = CliRunner().invoke(app, ["schedule", "-f", str(broken), "--device-config",
                                     str(DEVICE_CONFIG), "--enable-ascend"])
    assert "node mixed-1 registered without some devices" in table.output
