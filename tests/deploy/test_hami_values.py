"""A HAMi operator's values files with hami's chart (issue 14 §1): HAMi v2.10's own
defaults and a typical user file pass the schema and render processes that `hami <cmd>`
accepts; HAMi's keys with a meaning here are mapped (image tags, Ascend, Iluvatar, the
vendors' switches and resource names), the rest are listed by NOTES.txt. The same files
are installed on a real apiserver in tests/deploy/e2e/test_hami_values_on_apiserver.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    NAMESPACE,
    container,
    find,
    helm,
    render,
    render_notes,
    scheduler_config,
)

pytestmark = pytest.mark.usefixtures("require_helm")

HAMI_VALUES = Path(__file__).parent / "hami_values"
DEFAULTS = HAMI_VALUES / "hami-v2.10-defaults.yaml"
USER = HAMI_VALUES / "hami-user.yaml"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def hami_containers(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every container (init included) of the chart that runs `hami <cmd>`."""
    out = []
    for obj in objs:
        if obj["kind"] in ("Deployment", "DaemonSet"):
            spec = obj["spec"]["template"]["spec"]
            out += [c for c in (spec.get("initContainers") or []) + spec["containers"]
                    if c.get("command", [""])[0] == "hami"]
    return out


def parse_with_hami(sub: str, args: list[str]) -> dict[str, Any]:
    """Parse ``args`` with the real `hami <sub>` command (the installed CLI's own parser);
    click raises UsageError / BadParameter on anything it does not accept."""
    import typer

    from hami.cli import app

    group = typer.main.get_command(app)
    parent = group.make_context("hami", [sub], resilient_parsing=True)
    cmd = group.get_command(parent, sub)  # type: ignore[attr-defined]
    assert cmd is not None, sub
    return dict(cmd.make_context(sub, list(args), parent=parent).params)


def _cli_takes_hamis_klog_flags() -> bool:
    try:
        parse_with_hami("monitor", ["-v=4"])
        return True
    except Exception:  # noqa: BLE001 - click's UsageError / BadParameter
        return False


@pytest.mark.parametrize("path", [DEFAULTS, USER], ids=lambda p: p.stem)
def test_hami_values_files_pass_the_schema_and_lint(path: Path) -> None:
    proc = helm("lint", str(CHART), "--strict", "--kube-version", "v1.37.2", "-n", NAMESPACE,
                "-f", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(("values", "message"), [
    ({"schedular": {"replicas": 2}}, "additional properties 'schedular' not allowed"),
    ({"devicePlugin": {"deviceSplitCount": "ten"}}, "deviceSplitCount': got string, want integer"),
    ({"devices": {"nvidia": {"gpuCorePolicy": "hard"}}}, "gpuCorePolicy': value must be one of"),
    ({"devices": {"ascend": {"enabled": True, "configs": [{"chipName": "910A"}]}}},
     "missing property 'commonWord'"),
])
def test_schema_refuses_typos_and_wrong_types(values: dict[str, Any], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        render(values)


def test_hami_image_tag_and_image_do_not_name_hami_images() -> None:
    """HAMi's global.imageTag (v2.10.0) and repository projecthami/hami are HAMi's Go image:
    hami's images keep their own names and the chart's version."""
    # HAMi's registry for its Go image (docker.io) is not taken for hami's: an image name
    # in Docker Hub's hami/ namespace would pull whatever someone publishes there (issue 28)
    images = {c["image"] for c in hami_containers(render(files=[DEFAULTS]))}
    assert images == {f"hami.invalid/hami/hami-scheduler:{APP_VERSION}",
                      f"hami.invalid/hami/hami-device-plugin:{APP_VERSION}"}
    pinned = render({"global": {"imageTag": "v2.10.0", "hamiImageTag": "0.9.1"},
                     "devicePlugin": {"image": {"tag": "0.9.2"}}})
    assert {c["image"] for c in hami_containers(pinned)} == {
        "hami.invalid/hami/hami-scheduler:0.9.1", "hami.invalid/hami/hami-device-plugin:0.9.2"}
    mine = render({"global": {"imageRegistry": "registry.example.com"}}, files=[DEFAULTS])
    assert {c["image"] for c in hami_containers(mine)} == {
        f"registry.example.com/hami/hami-scheduler:{APP_VERSION}",
        f"registry.example.com/hami/hami-device-plugin:{APP_VERSION}"}


def test_kube_scheduler_image_tag_of_older_hami_charts() -> None:
    def image(values: dict[str, Any]) -> str:
        deploy = find(render(values), "Deployment", "hami-scheduler")
        return str(container(deploy["spec"]["template"]["spec"], "kube-scheduler")["image"])

    assert image({"scheduler": {"kubeScheduler": {"imageTag": "v1.31.4"}}}) == \
        "registry.k8s.io/kube-scheduler:v1.31.4"
    assert image({"scheduler": {"kubeScheduler": {"imageTag": "v1.31.4",
                                                  "image": {"tag": "v1.32.0"}}}}) == \
        "registry.k8s.io/kube-scheduler:v1.32.0"


def _hami_args(objs: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {c["name"]: list(c.get("args") or []) for c in hami_containers(objs)}


@pytest.mark.parametrize("path", [DEFAULTS, USER], ids=lambda p: p.stem)
def test_hamis_process_flags_reach_the_processes(path: Path) -> None:
    """HAMi's chart passes `--debug -v=4` to the extender and `-v=4` to the device plugin
    and monitor; the same values pass them to hami's processes."""
    args = _hami_args(render(files=[path]))
    assert args["vgpu-scheduler-extender"][-2:] == ["--debug", "-v=4"]
    assert args["device-plugin"][-1] == "-v=4"
    assert args["vgpu-monitor"][-1] == "-v=4"


@pytest.mark.xfail(not _cli_takes_hamis_klog_flags(), strict=True,
                   reason="`hami <cmd>` does not take HAMi's -v/--debug yet (issue 14 §1, CLI part)")
@pytest.mark.parametrize("path", [DEFAULTS, USER], ids=lambda p: p.stem)
def test_hami_values_files_start_processes_hami_accepts(path: Path) -> None:
    for c in hami_containers(render(files=[path])):
        parse_with_hami(c["command"][1], list(c.get("args") or []))


def _device_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(yaml.safe_load(find(objs, "ConfigMap", "hami-scheduler-device")["data"]
                               ["device-config.yaml"]))


def _scheduler_settings(objs: list[dict[str, Any]], tmp_path: Path) -> Any:
    """The SchedulerConfig the hami scheduler builds from the rendered file and flags."""
    from hami.settings import scheduler_config as build

    deploy = find(objs, "Deployment", "hami-scheduler")
    args = container(deploy["spec"]["template"]["spec"], "vgpu-scheduler-extender")["args"]
    path = tmp_path / "device-config.yaml"
    path.write_text(find(objs, "ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"])
    return build(path, enable_ascend="--enable-ascend" in args,
                 enable_iluvatar="--enable-iluvatar" in args)


@pytest.mark.parametrize("values", [
    {"devices": {"ascend": {"enabled": True}, "iluvatar": {"enabled": True}}},
    {"devices": {"ascend": {"enabled": True, "configs": [
        {"commonWord": "Ascend910B3", "chipName": "910B3", "memoryAllocatable": 65536,
         "memoryCapacity": 65536, "aiCore": 20, "aiCPU": 7,
         "templates": [{"name": "vir05_1c_16g", "memory": 16384, "aiCore": 5, "aiCPU": 1}]}]}}},
])
def test_ascend_and_iluvatar_are_enabled_like_every_other_vendor(
        values: dict[str, Any], tmp_path: Path) -> None:
    """Enabled from the chart: the scheduler registers the chips, kube-scheduler leaves
    their resources to hami, and the admission policy guards their annotations."""
    from hami.core.provenance import allocation_keys

    objs = render(values)
    config = _scheduler_settings(objs, tmp_path)
    words = set(config.vendors())
    ascend = {c["commonWord"] for c in _device_config(objs)["vnpus"]["configs"]}
    assert ascend <= words and ascend
    if values["devices"].get("iluvatar"):
        assert {"MR-V100", "MR-V50", "BI-V100", "BI-V150"} <= words
    managed = {r["name"] for r in scheduler_config(objs)["extenders"][0]["managedResources"]}
    assert config.registry.resource_names() <= managed
    policy = find(objs, "ValidatingAdmissionPolicy", "hami-allocations")["spec"]
    (keys,) = [v["expression"] for v in policy["variables"] if v["name"] == "keys"]
    assert set(json.loads(keys)) == allocation_keys(config)


def test_ascend_and_iluvatar_are_off_by_default(tmp_path: Path) -> None:
    objs = render()
    doc = _device_config(objs)
    assert "vnpus" not in doc and "iluvatars" not in doc
    deploy = find(objs, "Deployment", "hami-scheduler")
    args = container(deploy["spec"]["template"]["spec"], "vgpu-scheduler-extender")["args"]
    assert not {"--enable-ascend", "--enable-iluvatar"} & set(args)


def test_hamis_vendor_keys_map(tmp_path: Path) -> None:
    """HAMi's top-level resource names, devices.<vendor>.enabled and customresources."""
    objs = render({"mluResourceName": "cambricon.com/mlu-share",
                   "metaxsGPUTopologyAware": "true",
                   "devices": {"kunlun": {"enabled": False},
                               "amd": {"customresources": ["amd.com/gpu", "amd.com/extra"]},
                               "vendors": {"hygon": {"config": {"resourceCountName": "x/dcu"}}}},
                   "dcuResourceName": "hygon.com/ignored-as-config-wins"})
    doc = _device_config(objs)
    assert doc["cambricon"]["resourceCountName"] == "cambricon.com/mlu-share"
    assert doc["metax"]["sgpuTopologyAware"] is True
    assert doc["hygon"]["resourceCountName"] == "x/dcu"
    assert "kunlun" not in doc
    managed = {r["name"] for r in scheduler_config(objs)["extenders"][0]["managedResources"]}
    assert {"cambricon.com/mlu-share", "amd.com/extra"} <= managed
    assert not any(n.startswith("kunlunxin.com/") for n in managed)
    names = _scheduler_settings(objs, tmp_path).registry.resource_names()
    assert "cambricon.com/mlu-share" in names and names <= managed


#: HAMi keys the chart maps to something of its own (not listed as ignored).
MAPPED = {"global.imageTag", "mluResourceName", "mluResourceMem", "mluResourceCores",
          "dcuResourceName", "dcuResourceMem", "dcuResourceCores", "metaxResourceName",
          "metaxResourceCore", "metaxResourceMem", "metaxsGPUTopologyAware",
          "kunlunResourceName", "kunlunResourceVCountName", "kunlunResourceVMemoryName",
          "vastaiResourceName", "birenResourceName",
          *(f"devices.{v}.{k}" for v in ("amd", "awsneuron", "kunlun", "enflame", "mthreads",
                                         "vastai", "biren") for k in ("enabled", "customresources"))}
#: HAMi keys listed only when set to something other than HAMi's default.
LISTED_WHEN_SET = {"devices.ascend.hamiVnpuCore", "devices.ascend.runtimeClassName"}
#: Maps whose content is the user's (labels, selectors, security contexts, ...).
OPAQUE = {"labels", "annotations", "resources", "securityContext", "nodeSelector",
          "podAnnotations", "extraEnvs", "matchLabels", "nvidiaNodeSelector"}


def _paths(node: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in OPAQUE:
            out += _paths(value, path + ".")
        else:
            out.append(path)
    return out


def _defined(values: dict[str, Any], path: str) -> bool:
    node: Any = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_every_key_of_hamis_defaults_is_used_mapped_or_listed_as_ignored() -> None:
    ours = yaml.safe_load((CHART / "values.yaml").read_text())
    notes = render_notes(files=[DEFAULTS])
    listed = [line.strip()[2:].split(":")[0].split("=")[0]
              for line in notes.split("HAMi values this chart does not use", 1)[1].splitlines()
              if line.strip().startswith("- ")]
    hami = yaml.safe_load(DEFAULTS.read_text())
    unaccounted = []
    for path in _paths(hami):
        if any(path == k or path.startswith(k + ".") for k in listed):
            continue
        if path in MAPPED | LISTED_WHEN_SET or _defined(ours, path):
            continue
        unaccounted.append(path)
    assert not unaccounted, "HAMi keys neither used, mapped nor listed in NOTES.txt"
    assert "global.imageTag" in listed
    assert "scheduler.extender.image.repository" in listed


def test_notes_name_the_ignored_keys_of_a_user_file() -> None:
    notes = render_notes(files=[USER])
    section = notes.split("HAMi values this chart does not use", 1)[1]
    for key in ("scheduler.kubeQPS", "scheduler.kubeBurst", "devicePlugin.migStrategy",
                "devices.ascend.hamiVnpuCore", "global.imageTag=v2.10.0"):
        assert f"- {key}" in section, key
    for mapped in ("devices.ascend.enabled", "scheduler.kubeScheduler.imageTag",
                   "mluResourceName", "devices.kunlun"):
        assert f"- {mapped}" not in section, mapped
    assert "HAMi values" not in render_notes()


def test_notes_warn_when_the_monitor_cannot_read_other_users_files() -> None:
    """HAMi's defaults give the monitor SYS_ADMIN instead of DAC_OVERRIDE (lists replace)."""
    assert "has no DAC_OVERRIDE" in render_notes(files=[DEFAULTS])
    assert "DAC_OVERRIDE" not in render_notes()
