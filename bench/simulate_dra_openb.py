"""DRA mode against extender mode (and the FGD paper's FGD) on the four openb workloads.

Runs ``hami simulate --mode dra`` (:class:`hami.sim.command.Simulation` with the
policies ``FGD``, ``fragmentation-aware`` and ``fragmentation-aware@dra``) on the
workloads ``default``, ``gpushare100``, ``multigpu50`` and ``gpuspec25`` of the Alibaba
openb trace, and prints the median over the seeds of the unallocated GPU (% of
capacity) at 100 % arrived demand and the pods never placed, as a Markdown table.

The trace is read from ``$HAMI_OPENB_DIR`` or ``../shared/data/openb`` next to the
repository (the folder cluster-trace-gpu-v2023/csv of alibaba/clusterdata; never
committed).

Usage::

    PYTHONPATH=src python bench/simulate_dra_openb.py [--seeds 42-51] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

WORKLOADS = ("default", "gpushare100", "multigpu50", "gpuspec25")
POLICIES = ("FGD", "fragmentation-aware", "fragmentation-aware@dra")


def trace_dir() -> Path:
    """``$HAMI_OPENB_DIR`` or the sibling ``shared/data/openb``."""
    env = os.environ.get("HAMI_OPENB_DIR")
    return Path(env) if env else ROOT.parent.parent / "shared" / "data" / "openb"


def main() -> None:
    """Run and print the table."""
    from hami.sim.command import Simulation, parse_seeds, with_mode
    from hami.sim.trace import load_trace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    seeds = parse_seeds(args.seeds)
    policies = with_mode(["FGD", "fragmentation-aware"], "dra")
    table: dict[str, dict[str, dict[str, float]]] = {}
    for workload in args.workloads.split(","):
        nodes, pods = load_trace(trace_dir(), workload)
        results = Simulation(nodes, pods, policies, seeds).run()
        row: dict[str, dict[str, float]] = {}
        for policy in policies:
            mine = [r for r in results if r.policy == policy]
            row[policy] = {
                "unallocated_100": round(statistics.median(r.unallocated(100) for r in mine), 2),
                "failed": statistics.median(r.failed for r in mine),
                "per_seed": [round(r.unallocated(100), 2) for r in mine]}  # type: ignore[dict-item]
        table[workload] = row
        print(workload, json.dumps(row), file=sys.stderr, flush=True)
    print(f"Unallocated GPU % at 100 % arrived demand, median of seeds {args.seeds} "
          "(pods never placed, median):\n")
    print("| workload | " + " | ".join(policies) + " |")
    print("|---|" + "---:|" * len(policies))
    for workload, row in table.items():
        print(f"| {workload} | " + " | ".join(
            f"{row[p]['unallocated_100']:.2f} ({row[p]['failed']:g})" for p in policies) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps({"seeds": seeds, "table": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
