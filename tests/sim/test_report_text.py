"""What ``hami simulate`` tells its reader: every column explained (table and --help), a
MIG table whose columns agree, a plot that shows coinciding lines and keeps its legend off
the data, and a trace directory from $HAMI_TRACE_DIR."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hami.cli import app
from hami.sim import report

runner = CliRunner()
A100 = "A100-SXM4-40GB"
NODE_CSV = ("sn,cpu_milli,memory_mib,gpu,model,mode\n"
            + "".join(f"m{i},96000,786432,8,{A100},mig\n" for i in range(3))
            + "".join(f"v{i},64000,262144,8,V100M16,\n" for i in range(6)))
HEADER = ("policy", "50%", "100%", "130%", "frag@100", "failed", "s/run")


def test_help_explains_every_column() -> None:
    result = runner.invoke(app, ["simulate", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for name, meaning in report.COLUMNS:
        assert f"{name}: {meaning[:40]}" in text, name
    covered = " ".join(name for name, _ in report.COLUMNS)
    for column in HEADER:  # every header of the table has its entry
        assert column in covered or column.endswith("0%"), column
    assert "frag@100: fragmented GPU at 100 % arrived demand" in text


def test_table_is_followed_by_the_columns_meaning() -> None:
    result = runner.invoke(app, ["simulate", "--no-progress", "--policies", "binpack/binpack",
                                 "--scale", "0.05"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for name, meaning in report.COLUMNS:
        assert f"{name}: {' '.join(meaning.split()[:8])}" in text, name


def _mig_rows(output: str) -> list[list[str]]:
    table = output.split("MIG-mode GPUs", 1)[1]
    return [[c.strip() for c in line.split("│")[1:-1]] for line in table.splitlines()
            if line.startswith("│")]


def test_mig_table_profiles_add_up_to_the_instances(tmp_path: Path) -> None:
    """Instances, pods and profiles are read at the same point of the same replay: the
    profile counts add up to the instance count in every row (several seeds, so medians
    over seeds would not)."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_CSV)
    result = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--no-progress",
                                 "--seeds", "0-3", "--policies",
                                 "binpack/binpack,spread/spread,fragmentation-aware"],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    rows = _mig_rows(result.output)
    assert len(rows) == 3
    for policy, seed, instances, pods, _cores, _memory, profiles in rows:
        counts = [int(n) for n in re.findall(r" x(\d+)", profiles)]
        assert sum(counts) == int(instances), (policy, instances, profiles)
        assert int(pods) <= int(instances) and seed in {"0", "1", "2", "3"}


def test_json_mig_values_come_from_the_reported_seed(tmp_path: Path) -> None:
    import json

    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_CSV)
    result = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--no-progress", "--json",
                                 "--seeds", "0-2", "--policies", "binpack/binpack"])
    assert result.exit_code == 0, result.output
    mig = json.loads(result.stdout)["policies"]["binpack/binpack"]["mig"]
    assert mig["seed"] in (0, 1, 2)
    for point, held in mig["profiles_at"].items():
        assert sum(held.values()) == mig["instances"][point]


def test_coinciding_curves_are_grouped() -> None:
    same = {10: 5.0, 20: float("nan")}
    groups = report.coinciding({"a": same, "b": {10: 4.0, 20: 1.0}, "c": dict(same),
                                "d": {10: 5.0, 20: 1.0}})
    assert groups == [["a", "c"], ["b"], ["d"]]


def _summary(curves: dict[str, dict[int, float]]) -> dict[str, dict[str, object]]:
    return {name: {"unallocated": curve, "unallocated_full": curve}
            for name, curve in curves.items()}


def test_plot_labels_identical_lines_and_keeps_the_legend_off_the_axes() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    points = range(0, 131, 10)
    low = {p: max(100.0 - p, 5.0) for p in points}
    high = {p: max(100.0 - p, 9.0) for p in points}
    fig = report.plot_figure(_summary({"binpack/spread": low, "binpack/topology-aware": low,
                                       "fragmentation-aware": high}), "t")
    try:
        legend = fig.legends[0]
        labels = [t.get_text() for t in legend.get_texts()]
        assert labels == ["binpack/spread = binpack/topology-aware", "fragmentation-aware"]
        renderer = fig.canvas.get_renderer()
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), "legend over the data"
        markers = {line.get_marker() for ax in fig.axes for line in ax.get_lines()}
        assert len(markers) == 2 and "None" not in markers
    finally:
        plt.close(fig)


def test_trace_directory_from_the_environment(tmp_path: Path) -> None:
    trace = tmp_path / "csv"
    trace.mkdir()
    (trace / "openb_pod_list_default.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        + "".join(f"p{i},1000,2048,1,{m}\n" for i, m in enumerate([50, 200, 470, 1000] * 5)))
    (trace / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"n{i},64000,262144,8,V100M16\n" for i in range(3)))
    result = runner.invoke(app, ["simulate", "--no-progress", "--json", "--policies",
                                 "binpack/binpack"], env={"HAMI_TRACE_DIR": str(trace)})
    assert result.exit_code == 0, result.output
    assert '"trace_pods": 20' in result.stdout and str(trace) in result.stdout
    missing = runner.invoke(app, ["simulate", "--no-progress"],
                            env={"HAMI_TRACE_DIR": str(tmp_path / "nowhere")})
    assert missing.exit_code == 2
    assert "github.com/alibaba/clusterdata" in " ".join(missing.output.split())
