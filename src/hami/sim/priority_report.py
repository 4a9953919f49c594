"""``hami simulate --priority qos``: run the priority replays and show them (a table, or
JSON with ``--json``).

JSON schema (stable; ``schema`` is bumped on any incompatible change)::

    {
      "schema": "hami.simulate-priority/v1",
      "settings": {...the run's settings, as hami.simulate/v1...},
      "priorities": {"<qos>": int},             # the qos -> priority map used
      "rows": [
        {"policy": str, "preemption": bool,
         "ls_pods": int,
         "ls_pending_s": {"p50": int|null, "p99": int|null, "max": int|null},
         "ls_never_placed": int,
         "evicted": {"<qos>": int}, "never_placed": {"<qos>": int},
         "preemptions": int,
         "gpu_allocated_percent": float|null,   # mean over the trace's span
         "span_s": int, "seconds": float}
      ]
    }
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hami.sim.priority import (
    QOS_PRIORITY,
    PriorityResult,
    TimedPod,
    replay_priority,
)
from hami.sim.replay import workload_distribution
from hami.sim.trace import TraceNode, TracePod

SCHEMA = "hami.simulate-priority/v1"

#: What each column means (printed under the table and in ``--help``).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("preempt", "preemption off: a pod that fits nowhere waits until pods leave; on: a GPU pod "
     "that fits nowhere evicts lower-priority pods as hami's extender does (the same "
     "core function); the victims are re-created at once and queue again."),
    ("LS p50/p99/max (s)", "LS pending time: seconds from a latency-sensitive (LS) pod's "
     "creation to its placement, nearest-rank percentiles over the LS pods placed."),
    ("LS never placed", "LS pods still waiting when the replay ends (of 'LS pods')."),
    ("BE evicted", "evictions of best-effort (BE) pods (a pod evicted twice counts twice)."),
    ("BE never placed", "BE pods (first or re-created) still waiting at the end."),
    ("GPU alloc %", "GPU allocated, averaged over the trace's span (first creation to "
     "last deletion), % of the cluster's GPU capacity."),
    ("s/run", "wall time of one replay, seconds."),
)


def columns_help() -> str:
    """:data:`COLUMNS` as paragraphs (for ``--help``)."""
    return "\n\n".join(f"{name}: {text}" for name, text in COLUMNS)


def run_all(nodes: Sequence[TraceNode], trace_pods: Sequence[TracePod],
            timed: Sequence[TimedPod], policies: Sequence[str], split_count: int,
            progress: Callable[[str, int], None] | None = None) -> list[PriorityResult]:
    """Each policy without, then with, preemption. ``progress(description, n)`` is told
    of every ``n`` arrivals replayed."""
    dist = workload_distribution(trace_pods)
    results: list[PriorityResult] = []
    for policy in policies:
        for on in (False, True):
            label = f"{policy}, preemption {'on' if on else 'off'}"
            tick = None
            if progress is not None:
                def tick(n: int, _label: str = label) -> None:
                    progress(_label, n)
            results.append(replay_priority(nodes, timed, policy, dist, preemption=on,
                                           split_count=split_count, progress=tick))
    return results


def _pending(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def render_table(results: Sequence[PriorityResult], title: str, console: Console) -> Table:
    """One row per policy x preemption off/on; then what each column means."""
    table = Table(title=title, caption="The trace's own timeline; qos priorities: "
                  + ", ".join(f"{q} {p}" for q, p in QOS_PRIORITY.items()) + ". Columns:")
    table.add_column("policy", no_wrap=True)
    table.add_column("preempt")
    table.add_column("LS pods", justify="right")
    for name in ("p50", "p99", "max"):
        table.add_column(f"LS {name} (s)", justify="right")
    for name in ("LS never placed", "BE evicted", "BE never placed", "GPU alloc %", "s/run"):
        table.add_column(name, justify="right")
    for r in results:
        alloc = "-" if math.isnan(r.allocation_percent) else f"{r.allocation_percent:.2f}"
        table.add_row(r.policy, "on" if r.preemption else "off", f"{r.ls_pods}",
                      *(_pending(r.ls_pending(q)) for q in (50, 99, 100)),
                      f"{r.ls_never_placed}", f"{r.be_evicted}",
                      f"{r.never_placed.get('BE', 0)}", alloc, f"{r.seconds:.1f}")
    console.print(table)
    for name, text in COLUMNS:
        console.print(f"  [bold]{name}[/bold]: {text}", highlight=False)
    return table


def to_json(settings: Mapping[str, Any], results: Sequence[PriorityResult]) -> dict[str, Any]:
    """The ``hami.simulate-priority/v1`` document (module docstring)."""
    return {
        "schema": SCHEMA, "settings": dict(settings), "priorities": dict(QOS_PRIORITY),
        "rows": [{
            "policy": r.policy, "preemption": r.preemption, "ls_pods": r.ls_pods,
            "ls_pending_s": {"p50": r.ls_pending(50), "p99": r.ls_pending(99),
                             "max": r.ls_pending(100)},
            "ls_never_placed": r.ls_never_placed, "evicted": dict(r.evicted),
            "never_placed": dict(r.never_placed), "preemptions": r.preemptions,
            "gpu_allocated_percent": (None if math.isnan(r.allocation_percent)
                                      else r.allocation_percent),
            "span_s": r.span_s, "seconds": r.seconds} for r in results],
    }


def run_cli(nodes: Sequence[TraceNode], trace_pods: Sequence[TracePod],
            timed: Sequence[TimedPod], policies: Sequence[str], split_count: int,
            settings: Mapping[str, Any], title: str, json_out: bool,
            progress_bar: bool) -> list[PriorityResult]:
    """``hami simulate --priority``'s run and output: the table (or ``--json``) on stdout,
    a progress bar on stderr when asked for and useful."""
    err = Console(stderr=True)
    if progress_bar and (err.is_terminal or not json_out):
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err, transient=True) as bar:
            task = bar.add_task("replaying", total=2 * len(policies) * len(timed))

            def advance(description: str, n: int) -> None:
                bar.update(task, description=description, advance=n)
            results = run_all(nodes, trace_pods, timed, policies, split_count, advance)
    else:
        results = run_all(nodes, trace_pods, timed, policies, split_count)
    if json_out:
        sys.stdout.write(json.dumps(to_json(settings, results), indent=2) + "\n")
        return results
    out = Console() if Console().is_terminal else Console(width=140)
    render_table(results, title, out)
    out.print(f"{len(nodes)} nodes, {sum(n.gpu for n in nodes)} GPUs, {len(timed)} trace "
              f"pods on the trace's timeline; split count {split_count}.", soft_wrap=True)
    return results


__all__ = ["COLUMNS", "SCHEMA", "columns_help", "render_table", "run_all", "run_cli",
           "to_json"]
