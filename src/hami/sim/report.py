"""What ``hami simulate`` shows: a rich table, a JSON document, a PNG plot.

JSON schema (``hami simulate --json``), version ``hami.simulate/v1``::

    {
      "schema": "hami.simulate/v1",
      "settings": {
        "source": "trace" | "synthetic",
        "trace": "<dir>" | null,          # trace directory (null for the embedded default)
        "workload": "default",            # pod list name (synthetic: "synthetic-openb")
        "scale": 0.125 | null,            # synthetic only: fraction of the trace's size
        "seeds": [42, ...],               # one replay per seed and policy
        "policies": ["binpack/spread", ..., "fragmentation-aware"],
        "split_count": 20,                # tasks per GPU (deviceSplitCount)
        "tune": 1.3,                      # workload inflated to tune x GPU capacity
        "nodes": 1213, "gpus": 6212, "trace_pods": 8152,
        "points": [10, 20, ..., 130]      # arrived demand, % of GPU capacity
      },
      "policies": {
        "<policy>": {
          "unallocated_gpu_percent": {"10": 0.0, ..., "130": 4.8},   # median over seeds
          "gpu_allocation_percent": {"10": 10.0, ..., "130": 95.2},  # 100 - the above
          "fragmentation_percent": {"10": 0.6, ..., "130": 4.4},     # median over seeds
          "failed_pods": 2448.0,          # median over seeds, pods never placed
          "pods": 10843.0,                # median pods replayed (after inflation)
          "seconds": 5.1,                 # median wall time of one replay
          "per_seed": {"42": {"unallocated_gpu_percent": {...}, "failed_pods": 2448}},
          "mig": {                        # only when the node list has MIG-mode nodes
            "gpus": 16,                   # MIG-mode GPUs
            "instances": {"10": 12.0, ...},                   # MIG instances held
            "pods": {"10": 12.0, ...},                        # pods holding them
            "unallocated_cores_percent": {"10": 80.5, ...},   # of the MIG GPUs' cores
            "unallocated_memory_percent": {"10": 81.2, ...},  # of the MIG GPUs' memory
            "profiles": {"1g.5gb": 40.0, "7g.40gb": 2.0}      # instances at the end
          }
        }
      },
      "reference": {                      # only with a trace holding fgd_expected_results
        "<paper policy>": {"unallocated_gpu_percent": {"10": ..., "130": ...}}
      }
    }

A value that was never reached (arrived demand stops short of a point) is ``null``.
With a node list of one's own (``--nodes``) ``settings`` also holds ``"node_file"``, and
``"mig_gpus"`` when some nodes are in MIG mode; MIG values are medians over seeds, and the
unallocated shares count what the chosen profiles really take (their memory and cores).
Policies are ``<node-policy>/<gpu-policy>`` for HAMi's policies and
``fragmentation-aware`` for ours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

SCHEMA = "hami.simulate/v1"
#: The plot's right panel starts at this arrived-demand point.
ZOOM_FROM = 80
#: The table starts at this arrived-demand point (the JSON has every point).
TABLE_FROM = 50


def _num(value: float) -> float | None:
    return None if value is None or math.isnan(value) else round(float(value), 4)


def _keyed(curve: Mapping[int, float], points: Sequence[int]) -> dict[str, float | None]:
    return {str(p): _num(curve.get(p, float("nan"))) for p in points}


def to_json(settings: Mapping[str, Any], summary: Mapping[str, Mapping[str, Any]],
            results: Sequence[Any], points: Sequence[int],
            reference: Mapping[str, Mapping[int, float]] | None = None) -> dict[str, Any]:
    """The JSON document described in the module docstring."""
    policies: dict[str, Any] = {}
    for policy, s in summary.items():
        per_seed = {
            str(r.seed): {
                "unallocated_gpu_percent": _keyed({p: 100.0 - r.allocation.get(p, math.nan)
                                                   for p in points}, points),
                "failed_pods": r.failed,
            }
            for r in results if r.policy == policy
        }
        policies[policy] = {
            "unallocated_gpu_percent": _keyed(s["unallocated"], points),
            "gpu_allocation_percent": _keyed({p: 100.0 - v for p, v in s["unallocated"].items()},
                                             points),
            "fragmentation_percent": _keyed(s["fragmentation"], points),
            "failed_pods": s["failed"],
            "pods": s["pods"],
            "seconds": round(s["seconds"], 3),
            "per_seed": per_seed,
        }
        if "mig" in s:
            m = s["mig"]
            policies[policy]["mig"] = {
                "gpus": m["gpus"],
                "instances": _keyed(m["instances"], points),
                "pods": _keyed(m["pods"], points),
                "unallocated_cores_percent": _keyed(m["unallocated_cores"], points),
                "unallocated_memory_percent": _keyed(m["unallocated_memory"], points),
                "profiles": {k: _num(v) for k, v in m["profiles"].items()},
            }
    doc: dict[str, Any] = {"schema": SCHEMA, "settings": {**settings, "points": list(points)},
                           "policies": policies}
    if reference:
        doc["reference"] = {name: {"unallocated_gpu_percent": _keyed(curve, points)}
                            for name, curve in reference.items()}
    return doc


def _fmt(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"


def render_table(summary: Mapping[str, Mapping[str, Any]], points: Sequence[int],
                 title: str, reference: Mapping[str, Mapping[int, float]] | None = None,
                 console: Console | None = None) -> Table:
    """One row per policy: unallocated GPU % at each arrived-demand point (median over
    seeds), fragmentation at 100 %, failed pods and time per replay; best at 100 % in
    bold. Paper reference rows (if given) come last, dimmed."""
    points = [p for p in points if p >= TABLE_FROM] or list(points)
    table = Table(title=title, caption="Unallocated GPU (% of capacity) at arrived GPU "
                  f"demand (% of capacity; below {TABLE_FROM} % nearly everything fits, "
                  "see --json); lower is better. Median over seeds.")
    table.add_column("policy", no_wrap=True)
    for p in points:
        table.add_column(f"{p}%", justify="right", no_wrap=True)
    table.add_column("frag@100", justify="right")
    table.add_column("failed", justify="right")
    table.add_column("s/run", justify="right")
    at100 = {k: v["unallocated"].get(100, math.nan) for k, v in summary.items()}
    finite = [v for v in at100.values() if not math.isnan(v)]
    best = min(finite) if finite else math.nan
    for policy, s in summary.items():
        style = "bold green" if at100[policy] == best else None
        table.add_row(policy, *(_fmt(s["unallocated"].get(p, math.nan)) for p in points),
                      _fmt(s["fragmentation"].get(100, math.nan)), f"{s['failed']:.0f}",
                      f"{s['seconds']:.1f}", style=style)
    for name, curve in (reference or {}).items():
        table.add_row(f"paper {name}", *(_fmt(curve.get(p, math.nan)) for p in points),
                      "", "", "", style="dim")
    if console is not None:
        console.print(table)
    return table


#: The MIG table reads the usage at this arrived-demand point.
MIG_POINT = 100


def render_mig_table(summary: Mapping[str, Mapping[str, Any]],
                     console: Console | None = None) -> Table | None:
    """One row per policy: the MIG-mode GPUs' instances, pods and unallocated cores and
    memory (% of those GPUs, on the profiles' real sizes) at :data:`MIG_POINT` % arrived
    demand, and the instances per profile at the end. None when no policy has MIG data."""
    rows = {k: v["mig"] for k, v in summary.items() if "mig" in v}
    if not rows:
        return None
    gpus = next(iter(rows.values()))["gpus"]
    table = Table(title=f"MIG-mode GPUs ({gpus}) at {MIG_POINT} % arrived demand",
                  caption="Unallocated = not held by a MIG instance, counted on the chosen "
                  "profiles' cores and memory. Profiles: instances at the end of the replay. "
                  "Median over seeds.")
    table.add_column("policy", no_wrap=True)
    for name in ("instances", "pods", "unalloc cores %", "unalloc memory %"):
        table.add_column(name, justify="right")
    table.add_column("profiles")
    for policy, m in rows.items():
        profiles = ", ".join(f"{n} x{v:g}" for n, v in m["profiles"].items() if v) or "-"
        count = m["instances"].get(MIG_POINT, math.nan)
        pods = m["pods"].get(MIG_POINT, math.nan)
        table.add_row(policy, "-" if math.isnan(count) else f"{count:g}",
                      "-" if math.isnan(pods) else f"{pods:g}",
                      _fmt(m["unallocated_cores"].get(MIG_POINT, math.nan)),
                      _fmt(m["unallocated_memory"].get(MIG_POINT, math.nan)), profiles)
    if console is not None:
        console.print(table)
    return table


def write_plot(path: str | Path, summary: Mapping[str, Mapping[str, Any]], title: str,
               reference: Mapping[str, Mapping[int, float]] | None = None) -> Path:
    """Unallocated GPU % against arrived demand, one line per policy (paper Fig. 9a);
    reference curves dashed. Uses the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5), dpi=110,
                             gridspec_kw={"width_ratios": [1, 1.3]})
    colors = plt.get_cmap("tab20")(range(20))
    lines: list[tuple[str, dict[int, float], dict[str, Any]]] = []
    for i, (policy, s) in enumerate(summary.items()):
        ours = policy == "fragmentation-aware"
        lines.append((policy, s.get("unallocated_full") or s["unallocated"],
                      {"color": "black" if ours else colors[(2 * i) % 20],
                       "linewidth": 2.4 if ours else 1.3}))
    for j, (name, curve) in enumerate((reference or {}).items()):
        lines.append((f"paper {name}", dict(curve),
                      {"color": colors[(2 * j + 1) % 20], "linestyle": "--",
                       "linewidth": 1.0}))
    for ax, lo in zip(axes, (0, ZOOM_FROM), strict=True):
        top = 0.0
        for label, curve, style in lines:
            xs = [p for p in sorted(curve) if p >= lo and not math.isnan(curve[p])]
            ax.plot(xs, [curve[p] for p in xs], label=label, **style)
            top = max([top, *(curve[p] for p in xs)])
        ax.set_xlim(lo, 130)
        ax.set_xlabel("Arrived GPU demand (% of capacity)")
        ax.set_ylabel("Unallocated GPU (%)")
        ax.grid(True, alpha=0.3)
        if lo:
            ax.set_ylim(0, min(top, 100 - ZOOM_FROM + 5) * 1.05 or 1)
            ax.set_title(f"zoom: {ZOOM_FROM}..130 %")
    axes[0].set_title(title, fontsize=9)
    axes[1].legend(fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
