"""``hami simulate --priority qos`` from the command line, on a trace folder written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hami.cli import app
from hami.sim.replay import ALL_POLICIES

runner = CliRunner()
HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
          "creation_time,deletion_time,scheduled_time\n")


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """One node with one T4; BE holds it 0..100 s, LS arrives at 10 and runs 20 s."""
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,1,T4\n")
    (tmp_path / "openb_pod_list_default.csv").write_text(
        HEADER + "be,1000,1024,1,1000,,BE,Running,0,100,0\n"
        "ls,1000,1024,1,1000,,LS,Running,10,30,10\n")
    (tmp_path / "openb_pod_list_multigpu50.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,1000\n")
    return tmp_path


def test_json_rows_without_and_with_preemption(trace: Path) -> None:
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--priority", "qos",
                                 "--policies", "binpack/binpack", "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "hami.simulate-priority/v1"
    assert doc["priorities"] == {"LS": 1000, "Guaranteed": 1000, "Burstable": 1000, "BE": 0}
    assert doc["settings"]["priority"] == "qos"
    off, on = doc["rows"]
    assert (off["policy"], off["preemption"], on["preemption"]) == ("binpack/binpack",
                                                                    False, True)
    assert off["ls_pending_s"] == {"p50": 90, "p99": 90, "max": 90}
    assert (off["evicted"], off["preemptions"], off["ls_never_placed"]) == ({}, 0, 0)
    assert on["ls_pending_s"] == {"p50": 0, "p99": 0, "max": 0}
    assert (on["evicted"], on["preemptions"]) == ({"BE": 1}, 1)
    assert on["gpu_allocated_percent"] == pytest.approx(100.0) and on["span_s"] == 100


def test_table_and_the_default_policy_list(trace: Path) -> None:
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--priority", "qos",
                                 "--no-progress"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert "p99" in text and "evicted" in text and "preempt" in text
    rows = [line for line in text.splitlines() if line.startswith("│")]
    # 'all' under --priority: HAMi's policies and ours, each off then on (the paper's
    # schedulers have no priorities); none from the paper.
    assert len(rows) == 2 * len(ALL_POLICIES)
    assert [r.split("│")[2].strip() for r in rows[:2]] == ["off", "on"]
    assert not any("FGD" in r or "Random" in r for r in rows)
    assert "1 nodes, 1 GPUs, 2 trace pods on the trace's timeline" in " ".join(text.split())


def test_without_the_option_the_output_is_the_allocation_table(trace: Path) -> None:
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--policies",
                                 "binpack/binpack", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "BE evicted" not in result.output and "100%" in result.output


@pytest.mark.parametrize(("extra", "message"), [
    (["--priority", "qos"], "needs --trace DIR"),
    (["--trace", "TRACE", "--priority", "gold"], "unknown source 'gold'; known: qos"),
    (["--trace", "TRACE", "--priority", "qos", "--seeds", "42"], "leave out --seeds"),
    (["--trace", "TRACE", "--priority", "qos", "--tune", "2"], "leave out --seeds, --tune"),
    (["--trace", "TRACE", "--priority", "qos", "--plot", "PLOT"], "and --plot"),
    (["--trace", "TRACE", "--priority", "qos", "--workload", "multigpu50"],
     "has no creation_time/deletion_time"),
    (["--trace", "TRACE", "--priority", "qos", "--policies", "FGD,binpack/binpack"],
     "the paper's schedulers have no priorities"),
])
def test_errors_are_messages(trace: Path, extra: list[str], message: str) -> None:
    args = [str(trace) if a == "TRACE" else str(trace / "p.png") if a == "PLOT" else a
            for a in extra]
    result = runner.invoke(app, ["simulate", "--no-progress", *args],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_help_documents_the_option_and_the_mapping() -> None:
    text = " ".join(runner.invoke(app, ["simulate", "--help"],
                                  env={"COLUMNS": "250"}).stdout.split())
    assert "--priority" in text
    assert "LS 1000, Guaranteed 1000, Burstable 1000, BE 0" in text
    assert "LS p50/p99/max (s): LS pending time" in text
