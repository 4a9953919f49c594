from __future__ import annotations

from pathlib import Path

import pytest

from hami.sim.trace import (
    TraceError,
    load_nodes,
    load_pods,
    load_reference,
    load_trace,
    pod_file,
)

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,8000,32768,0,\n"
PODS11 = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
          "creation_time,deletion_time,scheduled_time\n"
          "p0,12000,16384,1,1000,,LS,Running,0,12537496,0\n"
          "p1,6000,12288,1,460,V100M16|V100M32,BE,Pending,427061,12902960,\n"
          "p2,4000,8192,0,0,,BE,Failed,5,6,5\n")
PODS5 = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,2048,8,1000\np1,500,1024,1,50\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_nodes_are_typed(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path, "n.csv", NODES))
    assert [(n.name, n.cpu_milli, n.memory_mib, n.gpu, n.model) for n in nodes] == [
        ("n0", 64000, 262144, 2, "P100"), ("n1", 8000, 32768, 0, "")]


def test_eleven_column_pods(tmp_path: Path) -> None:
    pods = load_pods(write(tmp_path, "p.csv", PODS11))
    assert [p.name for p in pods] == ["p0", "p1", "p2"]
    assert pods[1].gpu_spec == ("V100M16", "V100M32")
    assert pods[1].gpu_milli == 460 and pods[1].qos == "BE"
    assert pods[1].creation_time == 427061
    assert (pods[0].deletion_time, pods[0].scheduled_time) == (12537496, 0)
    assert (pods[1].deletion_time, pods[1].scheduled_time) == (12902960, None)
    assert pods[0].gpu_demand_milli == 1000 and pods[2].gpu_demand_milli == 0


def test_five_column_pods(tmp_path: Path) -> None:
    pods = load_pods(write(tmp_path, "p.csv", PODS5))
    assert pods[0].num_gpu == 8 and pods[0].gpu_demand_milli == 8000
    assert pods[1].gpu_spec == () and pods[1].creation_time is None
    assert pods[1].deletion_time is None and pods[1].scheduled_time is None


@pytest.mark.parametrize(("row", "message"), [
    ("p9,abc,1,1,1000", "line 3: column cpu_milli must be an integer, got 'abc'"),
    ("p9,1,1,1,1001", "line 3: column gpu_milli must be between 0 and 1000, got 1001"),
    ("p9,1,1,2,500", "only valid with num_gpu 1"),
    ("p9,1,1,0,500", "without a GPU"),
    ("p9,1,1,1,0", "num_gpu 1 with gpu_milli 0"),
    ("p9,-5,1,1,100", "column cpu_milli must be >= 0, got -5"),
    ("p9,1,1,1", "line 3: expected 5 columns, got 4"),
    (",1,1,1,100", "line 3: empty pod name"),
])
def test_bad_pod_rows_name_file_line_and_column(tmp_path: Path, row: str, message: str) -> None:
    path = write(tmp_path, "bad.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                 "p0,1,1,1,100\n" + row + "\n")
    with pytest.raises(TraceError, match="bad.csv") as exc:
        load_pods(path)
    assert message in str(exc.value)


def test_bad_header_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unexpected header"):
        load_pods(write(tmp_path, "h.csv", "name,cpu\np0,1\n"))
    with pytest.raises(TraceError, match="not found"):
        load_nodes(tmp_path / "absent.csv")
    with pytest.raises(TraceError, match="empty file"):
        load_nodes(write(tmp_path, "e.csv", ""))


def test_bad_node_rows(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="duplicate node 'n0'"):
        load_nodes(write(tmp_path, "n.csv", NODES + "n0,1,1,1,T4\n"))
    with pytest.raises(TraceError, match="has 2 GPUs but no model"):
        load_nodes(write(tmp_path, "n2.csv", "sn,cpu_milli,memory_mib,gpu,model\nx,1,1,2,\n"))


def test_workload_lookup_lists_what_is_there(tmp_path: Path) -> None:
    write(tmp_path, "openb_pod_list_default.csv", PODS11)
    write(tmp_path, "openb_pod_list_multigpu50.csv", PODS5)
    write(tmp_path, "openb_node_list_gpu_node.csv", NODES)
    assert pod_file(tmp_path, "default").name == "openb_pod_list_default.csv"
    with pytest.raises(TraceError, match="workloads there: default, multigpu50"):
        pod_file(tmp_path, "gpushare100")
    nodes, pods = load_trace(tmp_path, "multigpu50")
    assert len(nodes) == 2 and len(pods) == 2
    with pytest.raises(TraceError, match="trace directory not found"):
        load_trace(tmp_path / "nope")


def test_reference_is_median_unallocated(tmp_path: Path) -> None:
    ref = tmp_path / "fgd_expected_results"
    ref.mkdir()
    (ref / "analysis_allo_discrete.csv").write_text(
        "workload,sc_policy,tune,seed,total_gpus,0,100\n"
        "openb_pod_list_default,06-FGD,1.3,42,6212,0.1,95.0\n"
        "openb_pod_list_default,06-FGD,1.3,43,6212,0.2,96.0\n"
        "openb_pod_list_default,06-FGD,1.3,44,6212,,97.0\n"
        "openb_pod_list_other,06-FGD,1.3,42,6212,1,1\n")
    got = load_reference(tmp_path, "default")
    assert got == {"06-FGD": {0: pytest.approx(99.85), 100: pytest.approx(4.0)}}
    assert load_reference(tmp_path / "none", "default") == {}


def test_real_trace_profile(trace_dir: Path) -> None:
    nodes, pods = load_trace(trace_dir, "default")
    assert len(nodes) == 1213 and sum(n.gpu for n in nodes) == 6212
    assert len(pods) == 8152
    assert sum(p.gpu_demand_milli for p in pods) == 6_086_800
    assert len(load_pods(pod_file(trace_dir, "multigpu50"))) == 9061
