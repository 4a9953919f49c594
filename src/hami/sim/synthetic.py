"""An openb-like cluster and workload generated from published statistics, no files needed.

``hami simulate`` without ``--trace`` runs on this. The statistics live in
``hami/sim/data/openb_stats.json`` and were computed from the trace's GPU node list and
``default`` pod list by :func:`compute_stats` (``python -m hami.sim.synthetic DIR``);
they are aggregates (a node-model histogram, per task class a count and CPU/memory
quantiles), never rows of the trace.

Generation with a fixed seed:

* nodes: every (model, GPUs, CPU, memory) kind of the histogram, ``round(count x
  scale)`` times (at least once), in a shuffled order;
* pods: as many as the trace has, times ``scale``; each draws its class
  ``(num_gpu, gpu_milli)`` by frequency, then one uniform number ``u`` placed on both the
  CPU and the memory quantile curves of that class (keeping big-CPU tasks big-memory).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from hami.sim.trace import TraceNode, TracePod, load_trace

STATS_RESOURCE = "openb_stats.json"
#: Default fraction of the trace's size: 1/8 (about 150 nodes, 780 GPUs).
DEFAULT_SCALE = 0.125
DEFAULT_SEED = 0
QUANTILES = tuple(range(0, 101, 5))


def load_stats() -> dict[str, Any]:
    """The embedded statistics (package data)."""
    text = resources.files("hami.sim").joinpath("data", STATS_RESOURCE).read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def compute_stats(nodes: Sequence[TraceNode], pods: Sequence[TracePod]) -> dict[str, Any]:
    """Aggregate statistics of a node list and a pod list (see the module docstring)."""
    kinds = Counter((n.model, n.gpu, n.cpu_milli, n.memory_mib) for n in nodes if n.gpu > 0)
    classes: dict[tuple[int, int], list[TracePod]] = {}
    for p in pods:
        classes.setdefault((p.num_gpu, p.gpu_milli), []).append(p)
    pod_classes = []
    for (num, milli), members in sorted(classes.items(), key=lambda kv: -len(kv[1])):
        cpu = np.array([m.cpu_milli for m in members], dtype=np.float64)
        mem = np.array([m.memory_mib for m in members], dtype=np.float64)
        pod_classes.append({
            "num_gpu": num, "gpu_milli": milli, "count": len(members),
            "cpu_milli_quantiles": [int(v) for v in np.percentile(cpu, QUANTILES)],
            "memory_mib_quantiles": [int(v) for v in np.percentile(mem, QUANTILES)],
        })
    return {
        "source": "alibaba/clusterdata cluster-trace-gpu-v2023 (openb): "
                  "openb_node_list_gpu_node.csv and openb_pod_list_default.csv; "
                  "Weng et al., USENIX ATC'23. Aggregates only.",
        "quantile_levels": list(QUANTILES),
        "node_kinds": [{"model": m, "gpu": g, "cpu_milli": c, "memory_mib": mem, "count": k}
                       for (m, g, c, mem), k in sorted(kinds.items(),
                                                        key=lambda kv: (-kv[1], kv[0]))],
        "pod_count": len(pods),
        "pod_classes": pod_classes,
    }


def synthetic_nodes(stats: dict[str, Any], scale: float = DEFAULT_SCALE,
                    seed: int = DEFAULT_SEED) -> list[TraceNode]:
    """The node list: each kind ``max(1, round(count x scale))`` times, in an order
    shuffled with ``seed`` (the trace's node list interleaves the kinds too, and node
    order decides ties between equally good nodes)."""
    kinds: list[dict[str, Any]] = []
    for kind in stats["node_kinds"]:
        kinds.extend([kind] * max(1, round(kind["count"] * scale)))
    order = np.random.default_rng(seed).permutation(len(kinds))
    return [TraceNode(f"synth-node-{i:04d}", int(kinds[k]["cpu_milli"]),
                      int(kinds[k]["memory_mib"]), int(kinds[k]["gpu"]), kinds[k]["model"])
            for i, k in enumerate(order.tolist())]


def synthetic_pods(stats: dict[str, Any], scale: float = DEFAULT_SCALE,
                   seed: int = DEFAULT_SEED) -> list[TracePod]:
    """``round(pod_count x scale)`` pods drawn from the class frequencies."""
    rng = np.random.default_rng(seed)
    classes = stats["pod_classes"]
    levels = np.asarray(stats["quantile_levels"], dtype=np.float64) / 100.0
    weights = np.array([c["count"] for c in classes], dtype=np.float64)
    n = max(1, round(stats["pod_count"] * scale))
    picks = rng.choice(len(classes), size=n, p=weights / weights.sum())
    us = rng.random(n)
    pods: list[TracePod] = []
    for i, (k, u) in enumerate(zip(picks.tolist(), us.tolist(), strict=True)):
        c = classes[k]
        cpu = float(np.interp(u, levels, c["cpu_milli_quantiles"]))
        mem = float(np.interp(u, levels, c["memory_mib_quantiles"]))
        pods.append(TracePod(f"synth-pod-{i:05d}", int(round(cpu / 100.0) * 100),
                             int(round(mem / 256.0) * 256), int(c["num_gpu"]),
                             int(c["gpu_milli"])))
    return pods


def synthetic_trace(scale: float = DEFAULT_SCALE, seed: int = DEFAULT_SEED,
                    stats: dict[str, Any] | None = None
                    ) -> tuple[list[TraceNode], list[TracePod]]:
    """Nodes and pods of the embedded default (deterministic for a seed)."""
    stats = stats or load_stats()
    return synthetic_nodes(stats, scale, seed), synthetic_pods(stats, scale, seed)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hami.sim.synthetic TRACE_DIR``: print the statistics as JSON."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m hami.sim.synthetic TRACE_DIR > openb_stats.json",
              file=sys.stderr)
        return 2
    nodes, pods = load_trace(Path(args[0]), "default")
    print(json.dumps(compute_stats(nodes, pods), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
