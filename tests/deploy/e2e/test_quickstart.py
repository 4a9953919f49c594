"""docs/quickstart.md's script: from nothing to a GPU pod placed by hami on a local control
plane, with the chart's KubeSchedulerConfiguration, webhook and device config."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.chart import ROOT

pytestmark = pytest.mark.e2e


@pytest.mark.usefixtures("require_helm")
def test_quickstart_schedules_a_pod(tmp_path: Path) -> None:
    pytest.importorskip("hami.scheduler.command")
    proc = subprocess.run([sys.executable, str(ROOT / "deploy/local/quickstart.py"),
                           "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=400)
    out = proc.stdout + proc.stderr
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in tmp_path.glob("*.log"))
    assert proc.returncode == 0, out + logs
    assert "schedulerName set by the webhook: hami-scheduler" in out
    assert "bound to gpu-0; hami.io/vgpu-devices-allocated = GPU-quickstart-" in out
    assert "default/cuda-slice(3000,30)" in out  # hami top
    assert "SUCCESS" in out
    # Everything after the RBAC step ran as the chart's ServiceAccounts (kube-scheduler
    # with its own) under the chart's admission policies: their rights suffice.
    assert "token of hami-system/hami-scheduler " in out
    assert "token of hami-system/hami-kube-scheduler " in out
    for log in ("hami-scheduler.log", "kube-scheduler.log"):
        text = (tmp_path / log).read_text()
        assert "forbidden" not in text.lower(), text[-3000:]
    # client-go's wording: `successfully acquired lease hami-system/hami-scheduler` up to
    # v0.31, `"Successfully acquired lease" lock="hami-system/hami-scheduler"` later
    assert re.search(r'[Ss]uccessfully acquired lease"? (lock=")?hami-system/hami-scheduler',
                     (tmp_path / "kube-scheduler.log").read_text())
    assert "acquired leadership of hami-system/hami-scheduler" in \
        (tmp_path / "hami-scheduler.log").read_text()
    # The scheduler's /metrics as served over HTTP during the run passes promtool.
    from tests.deploy.test_metrics import promtool

    text = (tmp_path / "scheduler-metrics.txt").read_bytes()
    result = promtool(text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert b'pod="cuda-slice"' in text and b"hami_gpu_memory_limit_bytes{" in text
