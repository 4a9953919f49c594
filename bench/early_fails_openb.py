"""Early failures of multi-GPU pods on an openb workload: pods asking for two or more
GPUs that the live ``fragmentation-aware`` order leaves unplaced while the arrived GPU
demand is still under 90 % of capacity, with the stranding term (weight 3), without it
(weight 0), with the term and the whole-node guard
(:mod:`hami.core.fragmentation.wholeguard`), and as the live order has it (the guard when
the mix holds a multi-GPU class). The GPU-model pressure term is on in all four.

Replays each seed up to and including the pod whose arrival crosses 100 % of capacity,
as :meth:`hami.sim.replay.Replayer.run` does. Run::

    PYTHONPATH=src python bench/early_fails_openb.py --trace /path/to/openb \
        --workload default --seed 42 [--seed 43 ...]

Prints one line per seed and configuration: unallocated GPU % at 100 % arrived demand,
the count of early failures and the failures by arrived-demand decile and GPU count.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from hami.sim.replay import Replayer, workload_distribution
from hami.sim.trace import load_trace
from hami.sim.workload import DEFAULT_TUNE, prepare_workload

#: name -> (stranding weight, whole-node guard: True, False or None for the live rule).
CONFIGS: dict[str, tuple[float, bool | None]] = {
    "term": (3.0, False), "without": (0.0, False), "guard": (3.0, True), "live": (3.0, None)}
EARLY_PERCENT = 90


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--workload", default="default")
    ap.add_argument("--seed", type=int, action="append", required=True)
    ap.add_argument("--config", action="append", choices=sorted(CONFIGS),
                    help="only these configurations (default: all four)")
    args = ap.parse_args()
    nodes, trace_pods = load_trace(args.trace, args.workload)
    cap = 1000 * sum(n.gpu for n in nodes)
    for seed in args.seed:
        pods = prepare_workload(trace_pods, cap, seed, DEFAULT_TUNE)
        for name, (weight, guard) in CONFIGS.items():
            if args.config and name not in args.config:
                continue
            rep = Replayer(nodes, "fragmentation-aware", workload_distribution(trace_pods))
            rep.scorer.stranding_weight = weight
            rep.scorer.whole_node_guard = guard
            arrived = allocated = 0
            early: Counter[tuple[int, int]] = Counter()
            for pod in pods:
                node, granted = rep.schedule(rep.shapes.request(pod))
                percent = arrived * 100 // cap
                if node is None and pod.num_gpu >= 2 and percent < EARLY_PERCENT:
                    early[(percent // 10 * 10, pod.num_gpu)] += 1
                allocated += granted if node is not None else 0
                arrived += pod.num_gpu * pod.gpu_milli
                if arrived >= cap:
                    break
            print(f"{args.workload} seed {seed} {name}: unallocated "
                  f"{100 - 100 * allocated / cap:.2f} % early {sum(early.values())} "
                  + " ".join(f"{p}%x{g}gpu:{c}" for (p, g), c in sorted(early.items())))


if __name__ == "__main__":
    main()
