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
            "seed": 42,                   # the replay these values come from (below)
            "gpus": 16,                   # MIG-mode GPUs
            "instances": {"10": 12.0, ...},                   # MIG instances held
            "pods": {"10": 12.0, ...},                        # pods holding them
            "unallocated_cores_percent": {"10": 80.5, ...},   # of the MIG GPUs' cores
            "unallocated_memory_percent": {"10": 81.2, ...},  # of the MIG GPUs' memory
            "profiles_at": {"10": {"1g.5gb": 12}, ...},       # instances per profile
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
``"mig_gpus"`` when some nodes are in MIG mode; MIG values come from one replay, the seed
whose MIG instance count at 100 % arrived demand is the median (so that instances, profiles
and unallocated shares agree), and the unallocated shares count what the chosen profiles
really take (their memory and cores).
Policies are ``<node-policy>/<gpu-policy>`` for HAMi's policies,
``fragmentation-aware`` for ours and ``fragmentation-aware+lookahead`` for ours with a
one-arrival look-ahead (only when named in ``--policies``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hami.sim.metrics import MIG_POINT

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
                "seed": m["seed"],
                "gpus": m["gpus"],
                "instances": _keyed(m["instances"], points),
                "pods": _keyed(m["pods"], points),
                "unallocated_cores_percent": _keyed(m["unallocated_cores"], points),
                "unallocated_memory_percent": _keyed(m["unallocated_memory"], points),
                "profiles_at": {str(p): dict(v) for p, v in m["profiles_at"].items()},
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


#: What each column of the main table means (printed under it and in ``--help``).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "Random, DotProd, GpuClustering, GpuPacking, BestFit and FGD are the FGD "
     "paper's schedulers on its resource model; <node>/<gpu> are HAMi's node and GPU "
     "scheduler policies; fragmentation-aware is ours, fragmentation-aware+lookahead "
     "(only when named in --policies) ours with a one-arrival look-ahead, "
     "fragmentation-aware@dra (--mode dra) ours in DRA mode, the DRA allocator's first "
     "fit inside the node. 'paper X' rows "
     "(dimmed) are the paper's published figures, shown with a trace that holds them."),
    ("50% .. 130%", "unallocated GPU, as % of the cluster's GPU capacity, when the arrived "
     "GPU demand (every pod submitted so far, placed or not) first reaches that % of the "
     f"capacity; lower is better. Below {TABLE_FROM} % nearly everything fits (--json has "
     "every point from 10 %)."),
    ("frag@100", "fragmented GPU at 100 % arrived demand, as % of capacity: idle GPU that "
     "the workload's pods (its mix of GPU shares) could not use, because it lies in pieces "
     "smaller than they ask or on nodes short of CPU or memory; the FGD paper's measure, "
     "averaged over the workload's mix; at most the 100% column."),
    ("failed", "pods never placed, of all pods replayed (the workload asks for at least "
     "--tune x capacity)."),
    ("s/run", "wall time of one replay, seconds."),
)


def columns_help() -> str:
    """:data:`COLUMNS` as paragraphs ``column: meaning`` (for ``--help``)."""
    return "\n\n".join(f"{name}: {text}" for name, text in COLUMNS)


def render_table(summary: Mapping[str, Mapping[str, Any]], points: Sequence[int],
                 title: str, reference: Mapping[str, Mapping[int, float]] | None = None,
                 console: Console | None = None) -> Table:
    """One row per policy: unallocated GPU % at each arrived-demand point (median over
    seeds), fragmentation at 100 %, failed pods and time per replay; best at 100 % in
    bold. Paper reference rows (if given) come last, dimmed. With a console, the table is
    followed by what each column means (:data:`COLUMNS`)."""
    points = [p for p in points if p >= TABLE_FROM] or list(points)
    table = Table(title=title, caption="Median over seeds; lower is better; the best at "
                  "100 % in bold. Columns:")
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
        for name, text in COLUMNS:
            console.print(f"  [bold]{name}[/bold]: {text}", highlight=False)
    return table


def render_mig_table(summary: Mapping[str, Mapping[str, Any]],
                     console: Console | None = None) -> Table | None:
    """One row per policy: the MIG-mode GPUs' instances, pods, unallocated cores and
    memory (% of those GPUs, on the profiles' real sizes) and instances per profile, all at
    :data:`MIG_POINT` % arrived demand and all from one replay (the ``seed`` column, see
    :func:`hami.sim.metrics.summarize_mig`), so the profiles add up to the instances. None
    when no policy has MIG data."""
    rows = {k: v["mig"] for k, v in summary.items() if "mig" in v}
    if not rows:
        return None
    gpus = next(iter(rows.values()))["gpus"]
    table = Table(title=f"MIG-mode GPUs ({gpus}) at {MIG_POINT} % arrived demand",
                  caption="instances: MIG instances held; pods: pods holding them (a pod "
                  "may hold several); unalloc cores/memory %: of the MIG GPUs, not held by "
                  "an instance, on the chosen profiles' real sizes; profiles: the instances "
                  "by profile (they add up to instances). One replay per policy: the seed "
                  "with the median instance count.")
    table.add_column("policy", no_wrap=True)
    table.add_column("seed", justify="right")
    for name in ("instances", "pods", "unalloc cores %", "unalloc memory %"):
        table.add_column(name, justify="right")
    table.add_column("profiles")
    for policy, m in rows.items():
        held = m["profiles_at"].get(MIG_POINT, {})
        profiles = ", ".join(f"{n} x{v:g}" for n, v in sorted(held.items()) if v) or "-"
        count = m["instances"].get(MIG_POINT, math.nan)
        pods = m["pods"].get(MIG_POINT, math.nan)
        table.add_row(policy, str(m["seed"]), "-" if math.isnan(count) else f"{count:g}",
                      "-" if math.isnan(pods) else f"{pods:g}",
                      _fmt(m["unallocated_cores"].get(MIG_POINT, math.nan)),
                      _fmt(m["unallocated_memory"].get(MIG_POINT, math.nan)), profiles)
    if console is not None:
        console.print(table)
    return table


#: Marker shapes, one per line in turn, so that lines lying on each other stay visible.
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "*", "h", "p", "d", "8", "H")
#: A marker every this many arrived-demand points.
MARK_EVERY = 10


def coinciding(curves: Mapping[str, Mapping[int, float]]) -> list[list[str]]:
    """Names of ``curves`` grouped by identical curves (same points, values equal to 1e-6
    or both NaN), in first-seen order; a curve unlike every other is a group of one."""
    groups: dict[tuple[tuple[int, float | None], ...], list[str]] = {}
    for name, curve in curves.items():
        key = tuple((p, None if math.isnan(v) else round(v, 6)) for p, v in sorted(curve.items()))
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def plot_figure(summary: Mapping[str, Mapping[str, Any]], title: str,
                reference: Mapping[str, Mapping[int, float]] | None = None) -> Any:
    """The matplotlib figure of :func:`write_plot`: unallocated GPU % against arrived
    demand, all points and a zoom from :data:`ZOOM_FROM` %. Policies whose curves are
    identical share one line labelled ``a = b``; every line has its own marker; the
    legend sits right of both panels, off the data. The caller closes the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), dpi=110,
                             gridspec_kw={"width_ratios": [1, 1.3]})
    colors = plt.get_cmap("tab20")(range(20))
    curves = {policy: dict(s.get("unallocated_full") or s["unallocated"])
              for policy, s in summary.items()}
    lines: list[tuple[str, dict[int, float], dict[str, Any]]] = []
    for i, group in enumerate(coinciding(curves)):
        ours = "fragmentation-aware" in group
        look = not ours and "fragmentation-aware+lookahead" in group
        lines.append((" = ".join(group), curves[group[0]],
                      {"color": "black" if ours else "dimgray" if look
                       else colors[(2 * i) % 20],
                       "linewidth": 2.4 if ours else 2.0 if look else 1.3}))
    for j, (name, curve) in enumerate((reference or {}).items()):
        lines.append((f"paper {name}", dict(curve),
                      {"color": colors[(2 * j + 1) % 20], "linestyle": "--",
                       "linewidth": 1.0}))
    for ax, lo in zip(axes, (0, ZOOM_FROM), strict=True):
        top = 0.0
        for k, (label, curve, style) in enumerate(lines):
            xs = [p for p in sorted(curve) if p >= lo and not math.isnan(curve[p])]
            marks = [n for n, x in enumerate(xs) if x % MARK_EVERY == 0]
            ax.plot(xs, [curve[p] for p in xs], label=label if lo == 0 else None,
                    marker=MARKERS[k % len(MARKERS)], markevery=marks, markersize=4,
                    markerfacecolor="none", **style)
            top = max([top, *(curve[p] for p in xs)])
        ax.set_xlim(lo, 130)
        ax.set_xlabel("Arrived GPU demand (% of capacity)")
        ax.set_ylabel("Unallocated GPU (%)")
        ax.grid(True, alpha=0.3)
        if lo:
            ax.set_ylim(0, min(top, 100 - ZOOM_FROM + 5) * 1.05 or 1)
            ax.set_title(f"zoom: {ZOOM_FROM}..130 %")
    axes[0].set_title(title, fontsize=9)
    merged = any(" = " in label for label, _, _ in lines)
    fig.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.95),
               title="'a = b': identical curves" if merged else None, title_fontsize=7)
    fig.tight_layout()
    return fig


def write_plot(path: str | Path, summary: Mapping[str, Mapping[str, Any]], title: str,
               reference: Mapping[str, Mapping[int, float]] | None = None) -> Path:
    """Write :func:`plot_figure` (paper Fig. 9a; reference curves dashed) to a PNG. Uses the
    Agg backend (no display needed)."""
    import matplotlib.pyplot as plt

    fig = plot_figure(summary, title, reference)
    out = Path(path)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return out
