"""/metrics of both services passes ``promtool check metrics``; the Grafana dashboard only
queries HAMi's metric names and labels."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hami.devices.registry import make_config
from tests.deploy.chart import ROOT
from tests.deploy.metrics_names import ALL, EXTENSIONS, MONITOR, SCHEDULER

DASHBOARD = ROOT / "deploy" / "dashboards" / "hami-vgpu.json"
REQUIRED = os.environ.get("HAMI_DEPLOY_REQUIRED") == "1"


#: promtool lint findings on HAMi's own metric names, kept on purpose (renaming them would
#: break HAMi's dashboards and alerts). Nothing else may be reported.
KNOWN_HAMI_NAME_LINTS = {
    'hami_gpu_shared_count non-histogram and non-summary metrics should not have "_count" suffix',
}


def promtool(text: bytes) -> subprocess.CompletedProcess[str]:
    """``promtool check metrics`` on ``text``; returncode 0 also when the only findings are
    :data:`KNOWN_HAMI_NAME_LINTS` (promtool exits 3 for lint findings, 1 for errors)."""
    exe = shutil.which("promtool")
    if exe is None:
        if REQUIRED:
            pytest.fail("promtool missing (apt-get install prometheus)")
        pytest.skip("promtool missing (apt-get install prometheus)")
    proc = subprocess.run([exe, "check", "metrics"], input=text.decode(), capture_output=True,
                          text=True, timeout=60)
    findings = {line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip()}
    if proc.returncode == 3 and findings <= KNOWN_HAMI_NAME_LINTS:
        proc.returncode = 0
    return proc


def test_monitor_metrics_pass_promtool(tmp_path: Path) -> None:
    pytest.importorskip("hami.monitor.metrics")
    from hami.deviceplugin.allocate import ContainerView, PodView
    from hami.monitor.lister import ContainerLister
    from hami.monitor.metrics import HostGpu, MonitorCollector
    from tests.node.regionfile import Proc, RegionSpec, allocated, build

    u0, u1 = "GPU-aaaaaaaa-1111-2222-3333-444444444444", "GPU-bbbbbbbb-1111-2222-3333-4444"
    d = tmp_path / "containers" / "uid1_main"
    d.mkdir(parents=True)
    (d / "libvgpu.so").touch()
    (d / "a.cache").write_bytes(build(RegionSpec(
        uuids=(u0, u1), limits={0: 3000 << 20, 1: 5000 << 20}, last_kernel_time=1_000_000,
        procs=[Proc(pid=10, used={0: (100, 0, 900, 0, 1000), 1: (7, 0, 3, 0, 10)},
                    sm_util={0: 30, 1: 2})])))
    lister = ContainerLister(tmp_path / "containers")
    lister.update({"uid1"})
    migs = json.dumps([{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-m",
                        "profile": "1g.10gb", "placement": {"start": 0, "size": 1},
                        "migUUID": "MIG-x", "gpuInstanceID": 3, "computeInstanceID": 0}])
    pod = PodView("ns1", "p1", "uid1", "node-a", "Running",
                  {"hami.io/vgpu-mig-allocations": migs, **allocated((u0, u1))},
                  (ContainerView("main"),), 0)

    class Host:
        def gpus(self) -> list[HostGpu]:
            return [HostGpu(0, u0, "A100-SXM4-80GB", 5 << 20, 37, 12)]

    col = MonitorCollector("node-a", lister, lambda: [pod], Host(), clock=lambda: 1_000_042.0)
    text = col.render()
    proc = promtool(text)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = set(re.findall(r"^# TYPE (\S+) ", text.decode(), re.M))
    assert names == set(MONITOR), names ^ set(MONITOR)


def test_scheduler_metrics_pass_promtool() -> None:
    """The scheduler's registry over a known cluster state (the ``hami top`` fixture)."""
    pytest.importorskip("hami.scheduler.metrics")
    from types import SimpleNamespace

    from prometheus_client import generate_latest

    from hami.core.state import ClusterState
    from hami.scheduler.metrics import SchedulerMetrics
    from tests.deploy.top_cluster import objects

    nodes, pods, quotas = objects()
    state = ClusterState(make_config())
    for n in nodes:
        state.upsert_node(n)
    for q in quotas:
        state.upsert_quota(q)
    for p in pods:
        state.upsert_pod(p)
    metrics = SchedulerMetrics()
    metrics.attach(SimpleNamespace(state=state, config=state.config))  # type: ignore[arg-type]
    metrics.filter_done(0.004, "fit")
    metrics.bind_done(0.03, "bound")
    text = generate_latest(metrics.registry)
    proc = promtool(text)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = set(re.findall(r"^# TYPE (\S+) ", text.decode(), re.M))
    assert set(SCHEDULER) - {"hami_node_gpu_mig_instance_info"} <= names
    # prometheus_client adds <histogram>_created gauges unless disable_created_metrics().
    assert {n.removesuffix("_created") for n in names - set(SCHEDULER)} <= set(EXTENSIONS)


def test_reference_exposition_of_hami_names_passes_promtool() -> None:
    """Every HAMi name and label set the dashboard relies on is lint-clean Prometheus."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    class Ref:
        def collect(self):  # type: ignore[no-untyped-def]
            for name, labels in {**SCHEDULER, **MONITOR}.items():
                fam = GaugeMetricFamily(name, f"HAMi metric {name}", labels=list(labels))
                fam.add_metric(["x"] * len(labels), 1.0)
                yield fam

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Ref())
    proc = promtool(generate_latest(reg))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _exprs(node: object) -> list[str]:
    if isinstance(node, dict):
        out = [node["expr"]] if isinstance(node.get("expr"), str) else []
        for v in node.values():
            out += _exprs(v)
        return out
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def _base(name: str) -> str:
    """A histogram series name (``_bucket``/``_sum``/``_count``) -> its metric name."""
    if name in ALL:
        return name
    stem, _, suffix = name.rpartition("_")
    return stem if suffix in ("bucket", "sum", "count") and stem in EXTENSIONS else name


def test_dashboard_uses_only_hami_metric_names() -> None:
    doc = json.loads(DASHBOARD.read_text())
    exprs = _exprs(doc)
    assert len(exprs) >= 8
    used = set()
    for expr in exprs:
        for name in map(_base, re.findall(r"\b(hami_[a-z_]+)\b", expr)):
            used.add(name)
            assert name in ALL, f"{name} is not a HAMi metric"
        for series, body in re.findall(r"\b(hami_[a-z_]+)\{([^}]*)\}", expr):
            name = _base(series)
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", body):
                assert label in ALL[name] + ("zone",), f"{name} has no label {label}"
        for labels in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            for label in (lbl.strip() for lbl in labels.split(",")):
                assert any(label in ALL[_base(n)]
                           for n in re.findall(r"\b(hami_[a-z_]+)\b", expr)), \
                    f"by({label}) in {expr}"
    for needed in ("hami_gpu_memory_allocated_bytes", "hami_gpu_memory_limit_bytes",
                   "hami_vgpu_memory_used_bytes", "hami_vgpu_memory_limit_bytes",
                   "hami_resource_quota_used", "hami_gpu_core_allocated_ratio"):
        assert needed in used
    variables = {v["name"] for v in doc["templating"]["list"]}
    assert {"datasource", "node"} <= variables
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 36


def test_dashboard_promql_parses(tmp_path: Path) -> None:
    """Each panel query is valid PromQL (promtool parses it as a recording rule)."""
    import yaml

    exprs = [re.sub(r"\$\w+", ".*", e) for e in _exprs(json.loads(DASHBOARD.read_text()))]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"hami:dashboard_query:{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool missing (apt-get install prometheus)")
    proc = subprocess.run([exe, "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
