"""At 80 columns (issue 28): help texts wrap instead of cutting words with an ellipsis,
and ``hami schedule`` never breaks an annotation value or a patch inside a token."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = ["schedule", "scheduler", "simulate", "device-plugin", "dra-plugin", "monitor",
            "top", "certgen"]
NARROW = {"COLUMNS": "80", "LINES": "40"}


def _hami(*args: str, env: dict[str, str] = NARROW) -> str:
    """``hami ARGS`` in a subprocess, in the test's environment (read now: the suite hides
    the host's terminal settings for the test's time) plus ``env``."""
    p = subprocess.run([sys.executable, "-m", "hami.cli", *args], capture_output=True,
                       text=True, env={**os.environ, **env}, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_help_at_80_columns_is_not_cut(name: str) -> None:
    text = _hami(name, "--help")
    assert "…" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), \
        [line for line in text.splitlines() if len(line) > 80]


def test_root_help_at_80_columns_lists_whole_sentences() -> None:
    """``hami --help`` at 80 columns cut each command's line with ``...`` ("Dry-run
    admission and scheduling of the pending pods in...")."""
    text = _hami("--help")
    commands = text[text.index("Commands:"):]
    assert "..." not in commands and "…" not in commands, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    flat = " ".join(text.split()).replace("- ", "-")  # lines may break after a hyphen
    assert "Dry-run admission and scheduling of the pending pods in a cluster file." in flat
    assert "Run the scheduler extender + mutating webhook (HAMi's hami-scheduler)." in flat


def test_simulate_help_says_the_whole_trace_path_and_what_ten_seeds_cost() -> None:
    text = " ".join(_hami("simulate", "--help").split())
    assert "cluster-trace-gpu-v2023/csv" in text
    assert "'42-51' takes minutes" in text


CLUSTER = """\
kind: Node
metadata:
  name: n1
  annotations:
    hami.io/node-handshake: "Requesting_2024.01.01 00:00:00"
    hami.io/node-nvidia-register: '[{"id":"GPU-5a1e0000-0000-4000-8000-000000000001","count":10,"devmem":16000,"devcore":100,"type":"NVIDIA-T4","health":true,"numa":0,"mode":"hami-core","index":0}]'
---
kind: Pod
metadata: {name: training-job-with-a-long-name, namespace: default, uid: u1}
spec:
  containers:
  - name: c
    resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpucores: 20, nvidia.com/gpumem: 3000}}
"""


def test_schedule_at_80_columns_keeps_values_whole(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    lines = _hami("schedule", "-f", str(cluster)).splitlines()
    value = "vgpu-devices-allocated=GPU-5a1e0000-0000-4000-8000-000000000001,NVIDIA,3000,20:;"
    assert any(line.strip().endswith(value) for line in lines), lines
    assert any(line.strip() == "add /spec/schedulerName=hami-scheduler" for line in lines)
    assert "pod default/training-job-with-a-long-name" in lines
    wide = _hami("schedule", "-f", str(cluster), env={**NARROW, "COLUMNS": "250"})
    assert "┃ pod" in wide and value in wide  # the table where it fits
