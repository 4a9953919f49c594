"""``hami simulate`` with MIG-mode nodes (spec §6): profiles, placements, charging, report."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hami.cli import app
from hami.core.model import MigPlacement
from hami.sim import metrics
from hami.sim.mig import MIG_MODELS, MigModelError, mig_model, require_mig_model
from hami.sim.replay import Replayer, workload_distribution
from hami.sim.synthetic import synthetic_trace
from hami.sim.trace import TraceError, TraceNode, TracePod, load_nodes
from hami.sim.tracemap import build_ledger
from hami.sim.workload import prepare_workload

P = MigPlacement
A100 = "A100-SXM4-40GB"
runner = CliRunner()


def replay(nodes: list[TraceNode], pods: list[TracePod],
           policy: str = "binpack/binpack") -> Replayer:
    r = Replayer(nodes, policy, workload_distribution(pods))
    r.result = r.run(pods)  # type: ignore[attr-defined]
    return r


def held(r: Replayer, name: str) -> tuple[str, P] | None:
    """``(profile, placement)`` of pod ``name``'s single MIG instance, None if unplaced."""
    allocations = r.mig.get(name)
    if not allocations:
        return None
    (a,) = allocations
    return a.profile, a.placement


# ------------------------------------------------------------------ models and nodes
def test_profile_tables_follow_the_chart_allowlist_and_the_core_formula() -> None:
    a100 = mig_model(A100)
    assert a100 is not None and a100.name == "A100-40GB"
    assert [p.name for p in a100.profiles] == ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
    # core = ceil(SMs x 100 / full SMs): 14/98 -> 15, 42/98 -> 43, 98/98 -> 100
    assert [p.cores_percent for p in a100.profiles] == [15, 29, 43, 100]
    assert a100.max_instances == 7
    a30 = require_mig_model("NVIDIA A30")
    assert [p.name for p in a30.profiles] == ["1g.6gb", "2g.12gb", "4g.24gb"]
    assert a30.max_instances == 4
    assert require_mig_model("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert require_mig_model("NVIDIA H100 PCIe").name == "H100-80GB"
    assert mig_model("A100") is None  # ambiguous: 40 or 80 GB
    for model in MIG_MODELS:  # every profile fits its card; placements stay on the slices
        slices = 8 if model.max_instances == 7 else 4
        for p in model.profiles:
            assert p.memory_mib <= model.card_memory_mib
            assert all(pl.start + pl.size <= slices for pl in p.placements)
    with pytest.raises(MigModelError, match="'T4' cannot run in MIG mode"):
        require_mig_model("T4", "n1")


def test_ledger_registers_mig_gpus_as_the_device_plugin_does() -> None:
    led = build_ledger([TraceNode("m", 96000, 786432, 2, A100, "mig"),
                        TraceNode("c", 96000, 786432, 1, A100)])
    assert list(led.mig_mode[:3]) == [True, True, False]
    assert list(led.split_count[:3]) == [7, 7, 20]           # count = max instances
    assert list(led.total_memory_mib[:3]) == [40960] * 3      # the card's memory
    entry = led.node("m")
    assert entry is not None and entry.devices[0].mode == "mig"
    assert entry.devices[0].type == "NVIDIA-" + A100
    with pytest.raises(MigModelError):
        build_ledger([TraceNode("x", 1000, 1000, 1, "V100M16", "mig")])


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "nodes.csv"
    path.write_text(text)
    return path


def test_node_list_mode_column(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model,mode\n"
                                       f"a,1000,1024,2,{A100},mig\n"
                                       f"b,1000,1024,2,{A100},\n"
                                       "c,1000,1024,1,T4,hami-core\n"))
    assert [n.mode for n in nodes] == ["mig", "hami-core", "hami-core"]
    for row, message in [
        ("a,1000,1024,1,T4,mps", "line 2: column mode must be hami-core or mig, got 'mps'"),
        ("a,1000,1024,0,,mig", "line 2: node a is in mig mode but has no GPU"),
        ("a,1000,1024,1,V100M32,mig", "line 2: node a: GPU model 'V100M32' cannot run in "
                                      "MIG mode (MIG-capable models: A100-80GB"),
    ]:
        path = write(tmp_path, f"sn,cpu_milli,memory_mib,gpu,model,mode\n{row}\n")
        with pytest.raises(TraceError, match=message.replace("(", r"\(")):
            load_nodes(path)


# ------------------------------------------------------------------------- decisions
def test_each_pod_gets_the_smallest_profile_its_memory_fits() -> None:
    # memory = gpu_milli/10 % of the 40960 MiB card (spec §4.9 step 9), then §6.2
    pods = [TracePod("p50", 100, 100, 1, 50),     # 2048 MiB  -> 1g.5gb  (4864)
            TracePod("p110", 100, 100, 1, 110),   # 4505 MiB  -> 1g.5gb
            TracePod("p120", 100, 100, 1, 120),   # 4915 MiB  -> 2g.10gb (9984)
            TracePod("p470", 100, 100, 1, 470),   # 19251 MiB -> 3g.20gb (20096)
            TracePod("p500", 100, 100, 1, 500)]   # 20480 MiB -> 7g.40gb (40192)
    r = replay([TraceNode("m", 96000, 786432, 4, A100, "mig")], pods)
    profiles = {p.name: held(r, p.name)[0] for p in pods}  # type: ignore[index]
    assert profiles == {"p50": "1g.5gb", "p110": "1g.5gb", "p120": "2g.10gb",
                        "p470": "3g.20gb", "p500": "7g.40gb"}
    # the grant books the profile's memory and cores, not the request's
    for pod in r.ledger.pods():
        (dev,), = pod.devices
        profile = next(p for p in mig_model(A100).profiles  # type: ignore[union-attr]
                       if p.name == r.mig[pod.uid][0].profile)
        assert (dev.used_memory_mib, dev.used_cores_percent) == (profile.memory_mib,
                                                                 profile.cores_percent)


def test_used_up_1g_slots_move_the_next_small_pod_to_a_bigger_profile() -> None:
    r = replay([TraceNode("m", 96000, 786432, 1, A100, "mig")],
               [TracePod(f"s{i}", 100, 100, 1, 50) for i in range(7)]
               + [TracePod("late", 100, 100, 1, 50)])
    # 1g placements: the highest start first (spec §6.2), then down to 0
    assert [held(r, f"s{i}") for i in range(7)] == [("1g.5gb", P(s, 1))
                                                     for s in range(6, -1, -1)]
    assert held(r, "late") is None  # every slice is taken
    assert r.result.failed == 1  # type: ignore[attr-defined]
    # seven rounded-up 1g shares (7 x 15 cores) count as one whole GPU, not 105 %
    assert r.allocated_milli == metrics.allocated_milli(r.ledger) == 1000
    # with slice 6 held by a 3g-sized pod instead, the small pods fill 0..3 and the
    # fifth small pod finds no 1g, 2g or 3g placement left
    r = replay([TraceNode("m", 96000, 786432, 1, A100, "mig")],
               [TracePod("mid", 100, 100, 1, 470)]
               + [TracePod(f"s{i}", 100, 100, 1, 50) for i in range(5)])
    assert held(r, "mid") == ("3g.20gb", P(4, 4))   # 3g: highest start first
    assert [held(r, f"s{i}") for i in range(4)] == [("1g.5gb", P(s, 1)) for s in (3, 2, 1, 0)]
    assert held(r, "s4") is None


def test_a_full_gpu_rejects_and_a_whole_gpu_request_never_fits_a_mig_card() -> None:
    nodes = [TraceNode("m", 96000, 786432, 1, A100, "mig")]
    r = replay(nodes, [TracePod("big", 100, 100, 1, 600), TracePod("small", 100, 100, 1, 50)])
    assert held(r, "big") == ("7g.40gb", P(0, 8))
    assert held(r, "small") is None and r.ledger.pod("small") is None
    # 100 % of the card's 40960 MiB is more than the largest profile (40192 MiB): HAMi
    # rejects a whole-GPU percentage request on a MIG GPU, and so does the replay
    r = replay(nodes, [TracePod("whole", 100, 100, 1, 1000)])
    assert r.ledger.pod("whole") is None and r.result.failed == 1  # type: ignore[attr-defined]


def test_placements_never_overlap_on_a_busy_mixed_cluster() -> None:
    nodes, pods = synthetic_trace(scale=0.03, seed=1)
    nodes = nodes + [TraceNode(f"mig-{i}", 96000, 786432, 8, A100, "mig") for i in range(4)] \
        + [TraceNode("mig-a30", 96000, 786432, 4, "A30", "mig")]
    wl = prepare_workload(pods, 1000 * sum(n.gpu for n in nodes), seed=2)
    for policy in ("binpack/binpack", "spread/spread", "fragmentation-aware"):
        r = replay(nodes, wl, policy)
        by_gpu: dict[str, list[P]] = {}
        for allocations in r.mig.values():
            for a in allocations:
                by_gpu.setdefault(a.gpu_uuid, []).append(a.placement)
        assert sum(len(v) for v in by_gpu.values()) > 20, policy
        for uuid, placements in by_gpu.items():
            for a, b in combinations(placements, 2):
                assert not a.overlaps(b), (policy, uuid, a, b)
            assert sum(p.size for p in placements) <= (4 if "a30" in uuid else 8)
            node = uuid.rsplit("-gpu", 1)[0]
            assert sorted(r.ledger.mig_occupied(node)[uuid], key=lambda p: p.start) == \
                sorted(placements, key=lambda p: p.start)
        # the ledger's MIG usage is the sum of what the profiles take
        n = r.ledger.size
        mig = r.ledger.mig_mode[:n]
        assert (r.ledger.used_slots[:n][mig] <= r.ledger.split_count[:n][mig]).all()
        assert (r.ledger.used_memory_mib[:n] <= r.ledger.total_memory_mib[:n]).all()
        usage = r.result.mig_final  # type: ignore[attr-defined]
        assert usage.gpus == 36 and usage.instances == sum(len(v) for v in by_gpu.values())
        assert 0 <= usage.unallocated_cores_percent < 100
        assert r.allocated_milli == metrics.allocated_milli(r.ledger)


def test_without_mig_nodes_nothing_mig_is_recorded() -> None:
    r = replay([TraceNode("t", 1000, 1024, 1, "T4")], [TracePod("p", 100, 100, 1, 50)])
    assert r.mig_gpus == 0 and r.mig == {}
    assert r.result.mig == {} and r.result.mig_final is None  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------ CLI
NODE_CSV = ("sn,cpu_milli,memory_mib,gpu,model,mode\n"
            + "".join(f"m{i},96000,786432,8,{A100},mig\n" for i in range(2))
            + "a30,64000,262144,4,A30,mig\n"
            + "".join(f"v{i},64000,262144,8,V100M16,\n" for i in range(4))
            + "t0,64000,262144,4,T4,hami-core\n")


def test_cli_simulates_a_cluster_with_mig_nodes(tmp_path: Path) -> None:
    nodes = write(tmp_path, NODE_CSV)
    result = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--json", "--no-progress",
                                 "--seeds", "0,1", "--policies",
                                 "binpack/binpack,fragmentation-aware"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    s = doc["settings"]
    assert s["node_file"] == str(nodes) and s["nodes"] == 8 and s["gpus"] == 56
    assert s["mig_gpus"] == 20
    for entry in doc["policies"].values():
        mig = entry["mig"]
        assert mig["gpus"] == 20
        assert set(mig) == {"seed", "gpus", "instances", "pods", "unallocated_cores_percent",
                            "unallocated_memory_percent", "profiles_at", "profiles"}
        assert mig["instances"]["100"] > 0 and mig["pods"]["100"] <= mig["instances"]["100"]
        assert all(0 <= v <= 100 for v in mig["unallocated_cores_percent"].values())
        known = {p.name for m in MIG_MODELS for p in m.profiles}
        assert mig["profiles"] and set(mig["profiles"]) <= known
    table = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--no-progress",
                                "--policies", "spread/binpack"])
    assert table.exit_code == 0, table.output
    assert "MIG-mode GPUs (20) at 100 % arrived demand" in table.output
    assert "20 GPUs in MIG mode" in table.output


def test_cli_without_mig_nodes_prints_no_mig_section(tmp_path: Path) -> None:
    nodes = write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\nv,64000,262144,8,V100M16\n")
    result = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--json", "--no-progress",
                                 "--policies", "binpack/binpack"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert "mig_gpus" not in doc["settings"] and "mig" not in doc["policies"]["binpack/binpack"]


@pytest.mark.parametrize(("text", "message"), [
    ("sn,cpu_milli,memory_mib,gpu,model,mode\nn,1000,1024,1,T4,mig\n",
     "GPU model 'T4' cannot run in MIG mode"),
    ("sn,cpu_milli,memory_mib,gpu,model,mode\nn,1000,1024,1,T4,MIG-ish\n",
     "column mode must be hami-core or mig"),
    ("sn,cpu_milli,memory_mib,gpu,model,kind\nn,1000,1024,1,T4,mig\n", "unexpected header"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn,1000,1024,0,\n", "has no GPU node"),
])
def test_cli_bad_node_list_is_a_one_line_error(tmp_path: Path, text: str, message: str) -> None:
    result = runner.invoke(app, ["simulate", "--nodes", str(write(tmp_path, text)),
                                 "--no-progress"])
    assert result.exit_code == 2
    assert message in result.output
    assert result.output.strip().count("\n") == 0, result.output
    missing = runner.invoke(app, ["simulate", "--nodes", str(tmp_path / "nope.csv"),
                                  "--no-progress"])
    assert missing.exit_code == 2 and "file not found" in missing.output


def test_cli_binary_node_list_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nodes.bin"
    path.write_bytes(b"\xff\xfe\x00garbage")
    result = runner.invoke(app, ["simulate", "--nodes", str(path), "--no-progress"])
    assert result.exit_code == 2
    assert "nodes.bin" in result.output and "not a UTF-8 CSV" in result.output
    late = tmp_path / "late.csv"
    late.write_bytes(b"sn,cpu_milli,memory_mib,gpu,model\nn,1000,1024,1,T4\n\xff\xfe,1,1,1,T4\n")
    result = runner.invoke(app, ["simulate", "--nodes", str(late), "--no-progress"])
    assert result.exit_code == 2 and "late.csv" in result.output, result.output


def test_cli_trace_pods_on_a_node_list_of_ones_own(tmp_path: Path) -> None:
    """With --trace and --nodes the trace's node list is not read, and the paper's
    reference rows (figures for the trace's own cluster) are not shown."""
    trace = tmp_path / "openb"
    (trace / "fgd_expected_results").mkdir(parents=True)
    (trace / "openb_pod_list_default.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        + "".join(f"p{i},1000,2048,1,{m}\n" for i, m in enumerate([50, 200, 470, 1000] * 5)))
    (trace / "fgd_expected_results" / "analysis_allo_discrete.csv").write_text(
        "workload,policy,seed,100\nopenb_pod_list_default,06-FGD,42,95.0\n")
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_CSV)
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--nodes", str(nodes),
                                 "--json", "--no-progress", "--policies", "binpack/binpack"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["settings"]["source"] == "trace" and doc["settings"]["trace_pods"] == 20
    assert "reference" not in doc
    assert doc["policies"]["binpack/binpack"]["mig"]["instances"]["100"] > 0
    # without --nodes the same directory needs the trace's node list
    plain = runner.invoke(app, ["simulate", "--trace", str(trace), "--no-progress"])
    assert plain.exit_code == 2 and "openb_node_list_gpu_node.csv" in plain.output
