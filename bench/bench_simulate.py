"""Time and peak memory of one replay of the openb ``default`` workload, per policy
(the paper's six schedulers, HAMi's policies and ours: ``--policies all``).

Usage::

    PYTHONPATH=src python bench/bench_simulate.py [--trace DIR] [--seed 42]
        [--policies all|p1,p2] [--workload default] [--tracemalloc] [--json]

Each policy runs in a fresh child process, so its peak resident memory (``ru_maxrss``) is
its own: interpreter, numpy, the trace and the replay. ``replay_s`` is building the
ledger plus replaying every pod (wall clock; ``replay_cpu_s`` is the process CPU time,
steadier on a shared machine); ``load_s`` is reading the CSVs and preparing the
workload. With ``--tracemalloc`` the child also reports the peak of Python allocations
during the replay (slower; not used for the time). Target (issue): one policy, one seed
of ``default`` in <= 5 s and <= 500 MiB on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = (REPO / ".." / "shared" / "data" / "openb").resolve()
TARGET_S = 5.0
TARGET_MIB = 500.0


def one(trace: str, workload: str, policy: str, seed: int, use_tracemalloc: bool) -> dict:
    from hami.sim.paper import PAPER_POLICIES, run_paper
    from hami.sim.replay import CURVE_POINTS, REPORT_POINTS, Replayer, workload_distribution
    from hami.sim.trace import load_trace
    from hami.sim.workload import prepare_workload

    t0 = time.perf_counter()
    nodes, pods = load_trace(trace, workload)
    wl = prepare_workload(pods, 1000 * sum(n.gpu for n in nodes), seed)
    dist = workload_distribution(pods)
    t1 = time.perf_counter()
    if use_tracemalloc:
        import tracemalloc

        tracemalloc.start()
    c1 = time.process_time()
    if policy in PAPER_POLICIES:
        alloc, _, _, failed, _ = run_paper(nodes, wl, policy, dist, seed, CURVE_POINTS,
                                           REPORT_POINTS)
        at100 = 100.0 - alloc[100]
    else:
        res = Replayer(nodes, policy, dist).run(wl, seed)
        at100, failed = res.unallocated(100), res.failed
    t2 = time.perf_counter()
    c2 = time.process_time()
    out = {"policy": policy, "seed": seed, "pods": len(wl), "load_s": round(t1 - t0, 3),
           "replay_s": round(t2 - t1, 3), "replay_cpu_s": round(c2 - c1, 3),
           "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
           "unallocated_at_100": round(at100, 3), "failed": failed}
    if use_tracemalloc:
        out["tracemalloc_peak_mib"] = round(tracemalloc.get_traced_memory()[1] / 2**20, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--workload", default="default")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--policies", default="all")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.trace, args.workload, args.one, args.seed,
                             args.tracemalloc)))
        return 0
    if not (Path(args.trace) / "openb_node_list_gpu_node.csv").is_file():
        print(f"trace not found at {args.trace}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO / "src"))
    from hami.sim.command import parse_policies

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    rows = []
    for policy in parse_policies(args.policies):
        cmd = [sys.executable, __file__, "--one", policy, "--trace", args.trace,
               "--workload", args.workload, "--seed", str(args.seed)]
        if args.tracemalloc:
            cmd.append("--tracemalloc")
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["within_target"] = row["replay_s"] <= TARGET_S and row["peak_rss_mib"] <= TARGET_MIB
        rows.append(row)
        if not args.json:
            print(f"{policy:24s} replay {row['replay_s']:6.2f} s (cpu {row['replay_cpu_s']:5.2f} s)"
                  f"  load {row['load_s']:5.2f} s"
                  f"  peak RSS {row['peak_rss_mib']:6.1f} MiB"
                  + (f"  tracemalloc {row['tracemalloc_peak_mib']:5.1f} MiB"
                     if args.tracemalloc else "")
                  + f"  unallocated@100 {row['unallocated_at_100']:6.2f} %"
                  + ("" if row["within_target"] else "  (over target)"), flush=True)
    if args.json:
        print(json.dumps({"workload": args.workload, "seed": args.seed, "cpus": os.cpu_count(),
                          "target": {"seconds": TARGET_S, "mib": TARGET_MIB}, "rows": rows},
                         indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
