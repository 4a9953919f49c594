"""``make cluster NODE=chart``: the chart on the real test node kept running (issue 28,
the operator's first hour). The node itself runs in tests/realnode; here the command line,
the values merge and the make target."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hami.testing.chartbed_cli import EXAMPLE_COMMAND, merged_values, parse_args

REPO = Path(__file__).resolve().parents[2]


def test_values_files_merge_later_wins(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("scheduler:\n  overwriteEnv: 'false'\n  replicas: 1\n")
    b.write_text("scheduler:\n  replicas: 2\nnetworkPolicy:\n  enabled: false\n")
    args = parse_args(["up", "--values", str(a), "-f", str(b)])
    assert merged_values(args.values) == {
        "scheduler": {"overwriteEnv": "false", "replicas": 2},
        "networkPolicy": {"enabled": False}}
    assert (args.release, args.namespace) == ("hami", "hami-system")


def test_a_values_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="bad.yaml: not a mapping"):
        merged_values([bad])


def test_example_pod_keeps_running_for_the_metrics() -> None:
    assert EXAMPLE_COMMAND.endswith("hold")


def test_make_target_runs_the_chart_bed() -> None:
    out = subprocess.run(["make", "-n", "cluster", "NODE=chart", "VALUES=x.yaml y.yaml"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert ".venv/bin/python -m hami.testing.chartbed_cli up --release hami " \
        "--namespace hami-system --values x.yaml --values y.yaml" in " ".join(out.split()), out


def test_make_target_names_the_release() -> None:
    """The migration walkthrough starts "HAMi" as release hami in kube-system."""
    out = subprocess.run(["make", "-n", "cluster", "NODE=chart", "RELEASE=hami",
                          "RELEASE_NAMESPACE=kube-system"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "chartbed_cli up --release hami --namespace kube-system" in " ".join(out.split())
