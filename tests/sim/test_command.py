from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hami.sim.command import parse_policies, parse_seeds, simulate

app = typer.Typer()
app.command("simulate")(simulate)


@app.callback()
def _root() -> None:
    """Test app."""


runner = CliRunner()


def test_seed_and_policy_parsing() -> None:
    assert parse_seeds("42") == [42]
    assert parse_seeds("42-44,50,42") == [42, 43, 44, 50]
    with pytest.raises(ValueError):
        parse_seeds("5-3")
    with pytest.raises(ValueError):
        parse_seeds(",")
    assert len(parse_policies("all")) == 15
    assert parse_policies("paper") == ["Random", "DotProd", "GpuClustering", "GpuPacking",
                                       "BestFit", "FGD", "fragmentation-aware"]
    assert parse_policies("FGD,BestFit") == ["FGD", "BestFit"]
    assert parse_policies("spread/spread, fragmentation-aware") == [
        "spread/spread", "fragmentation-aware"]
    with pytest.raises(ValueError):
        parse_policies("binpack")


def test_json_schema_and_plot(tmp_path: Path) -> None:
    plot = tmp_path / "u.png"
    result = runner.invoke(app, ["simulate", "--scale", "0.03", "--seeds", "0,1", "--json",
                                 "--no-progress", "--policies",
                                 "binpack/binpack,fragmentation-aware", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "hami.simulate/v1"
    s = doc["settings"]
    assert s["source"] == "synthetic" and s["seeds"] == [0, 1] and s["split_count"] == 20
    assert s["tune"] == 1.3 and s["points"] == list(range(10, 131, 10))
    assert set(doc["policies"]) == {"binpack/binpack", "fragmentation-aware"}
    for entry in doc["policies"].values():
        curve = entry["unallocated_gpu_percent"]
        assert list(curve) == [str(p) for p in range(10, 131, 10)]
        assert all(v is None or 0 <= v <= 100 for v in curve.values())
        alloc = entry["gpu_allocation_percent"]
        assert all(alloc[k] == pytest.approx(100 - v) for k, v in curve.items() if v is not None)
        assert set(entry["per_seed"]) == {"0", "1"}
        assert set(entry) >= {"fragmentation_percent", "failed_pods", "pods", "seconds"}
    assert plot.is_file() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_output() -> None:
    result = runner.invoke(app, ["simulate", "--scale", "0.03", "--no-progress",
                                 "--policies", "spread/binpack"])
    assert result.exit_code == 0, result.output
    assert "spread/binpack" in result.output and "100%" in result.output


def test_errors_are_messages(tmp_path: Path) -> None:
    bad = runner.invoke(app, ["simulate", "--policies", "binpack/nope", "--no-progress"])
    assert bad.exit_code == 2 and "unknown policy" in bad.output
    low = runner.invoke(app, ["simulate", "--split-count", "10", "--no-progress"])
    assert low.exit_code == 2 and "at least 20" in low.output
    missing = runner.invoke(app, ["simulate", "--trace", str(tmp_path), "--no-progress"])
    assert missing.exit_code == 2 and "openb_node_list_gpu_node.csv" in missing.output


@pytest.mark.parametrize(("args", "words"), [
    (["--tune", "inf"], "--tune must be above 0 and at most 10 (the paper's 1.3 is the "
                        "default), got inf"),
    (["--tune", "nan"], "--tune must be above 0 and at most 10"),
    (["--tune", "0"], "--tune must be above 0 and at most 10"),
    (["--tune", "10.5"], "got 10.5"),
    (["--scale", "0"], "--scale must be above 0 and at most 4, got 0"),
    (["--scale", "nan"], "--scale must be above 0 and at most 4, got nan"),
])
def test_tune_and_scale_out_of_range_are_refused_before_the_run(
        args: list[str], words: str) -> None:
    """An infinite --tune inflated the pod list forever and NaN ran ("inflated to nanx
    capacity"); each bad value is one line naming its option."""
    result = runner.invoke(app, ["simulate", *args, "--policies", "FGD", "--no-progress"],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split()), result.output


def test_a_policy_list_naming_none_is_refused() -> None:
    """``--policies ,`` ran no policy and printed an empty table."""
    with pytest.raises(ValueError, match="names no policy"):
        parse_policies(", ,")
    result = runner.invoke(app, ["simulate", "--policies", ",", "--no-progress"],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 2, result.output
    assert "--policies ',' names no policy; give 'all', 'paper' or names such as " \
        "FGD,binpack/spread" in " ".join(result.output.split())


def test_plot_into_a_missing_directory_fails_before_the_run(tmp_path):
    from typer.testing import CliRunner

    from hami.cli import app

    result = CliRunner().invoke(app, ["simulate", "--no-progress", "--plot",
                                      str(tmp_path / "nope" / "x.png")])
    assert result.exit_code != 0
    assert "does not exist" in result.output


def _status_line(output: str) -> str:
    text = " ".join(output.split())
    return text[text.index(" nodes, "):]


def test_status_line_says_whether_the_pods_were_inflated(tmp_path: Path) -> None:
    """A node list smaller than the workload gets the trace pods as they are, so the line
    under the table gives their demand instead of claiming the inflation to --tune."""
    from hami.sim.synthetic import DEFAULT_SEED, synthetic_trace
    from hami.sim.workload import gpu_demand

    small = tmp_path / "small.csv"
    small.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,96000,786432,2,V100M16\n")
    result = runner.invoke(app, ["simulate", "--nodes", str(small), "--scale", "0.03",
                                 "--no-progress", "--policies", "binpack/binpack"])
    assert result.exit_code == 0, result.output
    _, pods = synthetic_trace(0.03, DEFAULT_SEED)
    demand = gpu_demand(pods) / 2000
    assert demand > 1.3
    line = _status_line(result.output)
    assert "inflated to" not in line, line
    assert (f"{len(pods)} trace pods asking for {demand:.3g}x capacity (not inflated: "
            "more than --tune 1.3)") in line, line

    default = runner.invoke(app, ["simulate", "--scale", "0.03", "--no-progress",
                                  "--policies", "binpack/binpack"])
    assert default.exit_code == 0, default.output
    assert "trace pods inflated to 1.3x capacity" in _status_line(default.output)


def test_lookahead_policy_runs_when_named_and_help_says_so() -> None:
    text = " ".join(runner.invoke(app, ["simulate", "--help"],
                                  env={"COLUMNS": "250"}).stdout.split())
    assert "fragmentation-aware+lookahead" in text
    result = runner.invoke(app, ["simulate", "--scale", "0.02", "--json", "--no-progress",
                                 "--policies", "fragmentation-aware+lookahead"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["settings"]["policies"] == ["fragmentation-aware+lookahead"]
    entry = doc["policies"]["fragmentation-aware+lookahead"]
    assert entry["pods"] > 0 and entry["unallocated_gpu_percent"]["100"] is not None


def test_dra_mode_runs_next_to_the_extender_mode_on_the_embedded_default() -> None:
    """``--mode dra`` adds DRA mode's row right after ``fragmentation-aware`` (added when
    not listed) in the same run, on the embedded synthetic default."""
    result = runner.invoke(app, ["simulate", "--json", "--no-progress", "--mode", "dra",
                                 "--policies", "binpack/spread"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["settings"]["policies"] == ["binpack/spread", "fragmentation-aware",
                                           "fragmentation-aware@dra"]
    for policy in doc["settings"]["policies"]:
        entry = doc["policies"][policy]
        assert entry["pods"] > 0 and entry["unallocated_gpu_percent"]["100"] is not None
    table = runner.invoke(app, ["simulate", "--no-progress", "--mode", "dra",
                                "--policies", "fragmentation-aware"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "fragmentation-aware@dra" in table.stdout
    bad = runner.invoke(app, ["simulate", "--no-progress", "--mode", "kubelet"])
    assert bad.exit_code == 2 and "--mode: unknown mode 'kubelet'" in bad.output
