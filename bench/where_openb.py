"""Where the unallocated GPU lies when an openb workload's arrived GPU demand reaches
100 %, under the live ``fragmentation-aware`` order (``hami simulate``'s replay, the
trace's task mix).

Replays one seed up to and including the pod whose arrival crosses 100 % of capacity
(:meth:`hami.sim.replay.Replayer.run`'s point) and splits the unallocated GPU milli:

* whole free GPUs against the free part of partly used GPUs, and the latter by size;
* by the node's free CPU and memory: under the smallest / the median CPU (memory) ask of
  the workload's GPU pods (a GPU there serves few or no tasks whatever its share);
* by GPU model, with how much of it is free and how many of the arrived GPU pods'
  classes may use that model (``gpu_spec``);
* the pods that failed by then, by share, GPU count and allowed models.

Run::

    PYTHONPATH=src python bench/where_openb.py --trace /path/to/openb \
        --workload gpuspec25 --seed 42

Prints one JSON object (milli-GPU; ``percent`` keys are % of cluster capacity).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hami.sim.replay import FRAGMENTATION_AWARE, Replayer, workload_distribution
from hami.sim.trace import TracePod, load_trace
from hami.sim.workload import DEFAULT_TUNE, prepare_workload


def where(trace: Path, workload: str, seed: int, policy: str = FRAGMENTATION_AWARE,
          point_percent: int = 100) -> dict[str, object]:
    """The breakdown described in the module docstring, as a JSON-able dict."""
    nodes, trace_pods = load_trace(trace, workload)
    cap = 1000 * sum(n.gpu for n in nodes)
    pods = prepare_workload(trace_pods, cap, seed, DEFAULT_TUNE)
    rep = Replayer(nodes, policy, workload_distribution(trace_pods))
    arrived = 0
    failed: list[TracePod] = []
    placed_gpu: list[TracePod] = []
    came: list[TracePod] = []
    for pod in pods:
        came.append(pod)
        node, _ = rep.schedule(rep.shapes.request(pod))
        if node is None:
            failed.append(pod)
        elif pod.num_gpu:
            placed_gpu.append(pod)
        arrived += pod.gpu_demand_milli
        if arrived * 100 >= point_percent * cap:
            break
    led, n = rep.ledger, rep.ledger.size
    on = led.node_of[:n] >= 0
    free_milli = np.where(on, (led.total_cores[:n] - np.minimum(led.used_cores[:n],
                                                                 led.total_cores[:n])) * 10, 0)
    node_of = led.node_of[:n]
    nn = led.node_count
    cpu_free = (led.cpu_milli_total[:nn] - led.cpu_milli_used[:nn]).astype(np.int64)
    mem_free = (led.memory_mib_total[:nn] - led.memory_mib_used[:nn]).astype(np.int64)
    gpu_pods = [p for p in trace_pods if p.num_gpu]
    cpu_asks = np.array([p.cpu_milli for p in gpu_pods])
    mem_asks = np.array([p.memory_mib for p in gpu_pods])
    whole = free_milli == 1000
    part = (free_milli > 0) & ~whole
    total_free = int(free_milli.sum())

    def pct(milli: float) -> float:
        return round(100 * milli / cap, 3)

    def split(mask: np.ndarray) -> dict[str, float]:
        return {"whole_gpus": int(whole[mask].sum()),
                "whole_percent": pct(int(free_milli[mask & whole].sum())),
                "partial_percent": pct(int(free_milli[mask & part].sum()))}

    dev_cpu = cpu_free[np.where(on, node_of, 0)]
    dev_mem = mem_free[np.where(on, node_of, 0)]
    short = {
        "cpu_below_min_ask": split(on & (dev_cpu < cpu_asks.min())),
        "cpu_below_median_ask": split(on & (dev_cpu < np.median(cpu_asks))),
        "memory_below_min_ask": split(on & (dev_mem < mem_asks.min())),
        "memory_below_median_ask": split(on & (dev_mem < np.median(mem_asks))),
    }
    sizes: Counter[int] = Counter()
    for f in free_milli[part]:
        sizes[int(f) // 100 * 100] += int(f)
    smallest_share = min(p.gpu_milli for p in gpu_pods)
    models = [led.type_names[int(t)] for t in led.type_id[:n]]
    by_model: dict[str, dict[str, float]] = defaultdict(lambda: {"gpus": 0, "free_milli": 0})
    for d in np.flatnonzero(on):
        m = by_model[models[d]]
        m["gpus"] += 1
        m["free_milli"] += int(free_milli[d])
    arrived_gpu = [p for p in came if p.num_gpu]
    specs = Counter(p.gpu_spec for p in arrived_gpu)
    spec_demand: Counter[tuple[str, ...]] = Counter()
    for p in arrived_gpu:
        spec_demand[p.gpu_spec] += p.gpu_demand_milli
    for model, m in by_model.items():
        short_name = model.removeprefix("NVIDIA-")
        m["free_percent"] = pct(m["free_milli"])
        m["arrived_demand_allowed_percent"] = pct(sum(
            v for s, v in spec_demand.items() if not s or short_name in s))
        m["arrived_demand_only_here_percent"] = pct(sum(
            v for s, v in spec_demand.items() if s and set(s) == {short_name}))
    fail = Counter((p.num_gpu, p.gpu_milli, "|".join(p.gpu_spec)) for p in failed)
    fail_gpu: Counter[str] = Counter()
    for p in failed:
        fail_gpu["|".join(p.gpu_spec) or "any"] += p.gpu_demand_milli
    return {
        "workload": workload, "seed": seed, "policy": policy, "capacity_milli": cap,
        "arrived_pods": len(came), "arrived_gpu_pods": len(arrived_gpu), "failed_pods": len(failed),
        "failed_gpu_percent": pct(sum(p.gpu_demand_milli for p in failed)),
        "unallocated_percent": pct(total_free),
        "whole_free_gpus": int(whole.sum()), "whole_free_percent": pct(int(free_milli[whole].sum())),
        "partial_free_percent": pct(int(free_milli[part].sum())),
        "partial_by_size_percent": {f"{k}-{k + 99}": pct(v) for k, v in sorted(sizes.items())},
        "partial_below_smallest_share_percent": pct(int(
            free_milli[part & (free_milli < smallest_share)].sum())),
        "smallest_share": smallest_share,
        "gpu_pod_cpu_ask_min_median": [int(cpu_asks.min()), float(np.median(cpu_asks))],
        "gpu_pod_memory_ask_min_median": [int(mem_asks.min()), float(np.median(mem_asks))],
        "short_nodes": short,
        "by_model": dict(sorted(by_model.items())),
        "arrived_specs": {("|".join(k) or "any"): v for k, v in specs.most_common()},
        "failed_by_spec_gpu_percent": {k: pct(v) for k, v in fail_gpu.most_common()},
        "failed_by_class": [{"num_gpu": k[0], "gpu_milli": k[1], "spec": k[2] or "any",
                             "pods": v} for k, v in fail.most_common(25)],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True, type=Path)
    ap.add_argument("--workload", default="default")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args(argv)
    print(json.dumps(where(args.trace, args.workload, args.seed), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
