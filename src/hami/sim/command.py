"""``hami simulate``: replay a GPU cluster trace through the scheduling core.

Registered by the CLI as ``app.command("simulate")(simulate)``. Without ``--trace`` it
runs the embedded synthetic openb-like default (:mod:`hami.sim.synthetic`), so it works
on a fresh machine with no files.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hami.sim import metrics, priority_report, report
from hami.sim.mig import MIG_MODELS
from hami.sim.paper import PAPER_POLICIES, run_paper
from hami.sim.priority import PRIORITY_SOURCES, QOS_PRIORITY, TimedPod, timed_pods
from hami.sim.replay import (
    ALL_POLICIES,
    CURVE_POINTS,
    FRAGMENTATION_AWARE,
    FRAGMENTATION_AWARE_DRA,
    KNOWN_POLICIES,
    REPORT_POINTS,
    Replayer,
    ReplayResult,
    parse_policy,
    workload_distribution,
)
from hami.sim.synthetic import DEFAULT_SCALE, DEFAULT_SEED, synthetic_trace
from hami.sim.trace import (
    TraceError,
    TraceNode,
    TracePod,
    load_nodes,
    load_pods,
    load_reference,
    load_trace,
    pod_file,
)
from hami.sim.tracemap import DEFAULT_SPLIT_COUNT
from hami.sim.workload import DEFAULT_TUNE, gpu_demand, prepare_workload

#: Environment variable that gives ``--trace`` when the option is not on the command line.
TRACE_ENV = "HAMI_TRACE_DIR"
#: Added to a "not found" error of --trace: where the trace comes from.
TRACE_HINT = ("--trace (or $HAMI_TRACE_DIR) names the folder cluster-trace-gpu-v2023/csv of "
              "https://github.com/alibaba/clusterdata; the README's 'hami simulate' section "
              "says how to get it")
#: The minimum tasks per GPU the trace needs (its smallest share is 50 milli).
MIN_SPLIT_COUNT = 20
#: The largest --tune: 10x capacity already leaves nearly every pod unplaced (the paper: 1.3).
MAX_TUNE = 10.0


def parse_seeds(text: str) -> list[int]:
    """``"42"``, ``"42,43"``, ``"42-51"`` (inclusive) or a mix -> list of seeds.

    Raises:
        ValueError: not integers, or an empty/descending range.
    """
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            if "-" in part[1:]:
                lo_text, hi_text = part.split("-", 1) if part[0] != "-" else ("", "")
                lo, hi = int(lo_text), int(hi_text)
                if hi < lo:
                    raise ValueError(f"--seeds: the range {part!r} runs backwards; write "
                                     f"it low-high, e.g. {hi}-{lo}")
                seeds.extend(range(lo, hi + 1))
            else:
                seeds.append(int(part))
        except ValueError as exc:
            if str(exc).startswith("--seeds"):
                raise
            raise ValueError(f"--seeds: {part!r} is not a seed; give whole numbers such as "
                             "42, a list 42,43 or a range 42-51") from None
    if not seeds:
        raise ValueError("--seeds: no seed given; e.g. 42, 42,43 or 42-51")
    return list(dict.fromkeys(seeds))


def parse_policies(text: str) -> list[str]:
    """``"all"`` (the paper's six schedulers, HAMi's policies and ours), ``"paper"`` (the
    paper's six and ours) or a comma list of policy names (validated). The opt-in
    policies (``fragmentation-aware+lookahead``) are in neither group: they run only
    when named.

    Raises:
        ValueError: an unknown policy name, or a list naming none (``","``).
    """
    if text.strip() in ("", "all"):
        return [*PAPER_POLICIES, *ALL_POLICIES]
    if text.strip() == "paper":
        return [*PAPER_POLICIES, FRAGMENTATION_AWARE]
    out = [p.strip() for p in text.split(",") if p.strip()]
    if not out:  # "," or ", ," named no policy: an empty table would say nothing
        raise ValueError(f"--policies {text!r} names no policy; give 'all', 'paper' or "
                         "names such as FGD,binpack/spread")
    for p in out:
        if p not in PAPER_POLICIES:
            try:
                parse_policy(p)
            except ValueError:
                raise ValueError(f"unknown policy {p!r}; known: "
                                 f"{', '.join((*PAPER_POLICIES, *KNOWN_POLICIES))}") from None
    return list(dict.fromkeys(out))


#: ``--mode`` values.
MODES = ("extender", "dra")


def with_mode(policy_list: list[str], mode: str) -> list[str]:
    """``policy_list`` for ``--mode``: as it is for ``extender``; for ``dra`` with
    :data:`~hami.sim.replay.FRAGMENTATION_AWARE_DRA` right after ``fragmentation-aware``
    (added at the end when not listed), so both modes are in one table.

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"--mode: unknown mode {mode!r}; known: {', '.join(MODES)}")
    if mode == "extender" or FRAGMENTATION_AWARE_DRA in policy_list:
        return policy_list
    out = [p for p in policy_list]
    if FRAGMENTATION_AWARE not in out:
        out.append(FRAGMENTATION_AWARE)
    out.insert(out.index(FRAGMENTATION_AWARE) + 1, FRAGMENTATION_AWARE_DRA)
    return out


@dataclass
class Simulation:
    """A set of replays: the cluster, the trace pods, and the settings."""

    nodes: list[TraceNode]
    pods: list[TracePod]
    policies: list[str]
    seeds: list[int]
    split_count: int = DEFAULT_SPLIT_COUNT
    tune: float = DEFAULT_TUNE
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def capacity_milli(self) -> int:
        """Cluster GPU capacity, milli-GPU."""
        return 1000 * sum(n.gpu for n in self.nodes)

    def run(self, progress: Progress | None = None) -> list[ReplayResult]:
        """Every policy x seed. The workload of a seed is the same for every policy."""
        dist = workload_distribution(self.pods)
        workloads = {s: prepare_workload(self.pods, self.capacity_milli, s, self.tune)
                     for s in self.seeds}
        task = None
        if progress is not None:
            total = len(self.policies) * sum(len(w) for w in workloads.values())
            task = progress.add_task("replaying", total=total)
        results: list[ReplayResult] = []
        for policy in self.policies:
            for seed in self.seeds:
                if progress is not None and task is not None:
                    progress.update(task, description=f"{policy} seed {seed}")

                    def advance(n: int, _task: Any = task) -> None:
                        progress.advance(_task, n)
                    cb = advance
                else:
                    cb = None
                if policy in PAPER_POLICIES:
                    results.append(self._run_paper(policy, seed, workloads[seed], dist, cb))
                    continue
                replayer = Replayer(self.nodes, policy, dist, self.split_count)
                results.append(replayer.run(workloads[seed], seed, cb))
        return results

    def _run_paper(self, policy: str, seed: int, pods: list[TracePod], dist: Any,
                   progress: Any) -> ReplayResult:
        """One of the paper's schedulers on its own resource model (:mod:`hami.sim.paper`)."""
        allocation, frag, scheduled, failed, seconds = run_paper(
            self.nodes, pods, policy, dist, seed, CURVE_POINTS, REPORT_POINTS, progress)
        return ReplayResult(policy, seed, len(pods), scheduled, failed, self.capacity_milli,
                            allocation, frag, seconds)


def _check_priority(priority: str, trace: Path | None, seeds: str | None,
                    plot: Path | None, tune: float) -> None:
    """``--priority``'s own checks (before any file is read).

    Raises:
        ValueError: an unknown source, no ``--trace``, or an option it has no use for.
    """
    if priority not in PRIORITY_SOURCES:
        raise ValueError(f"--priority: unknown source {priority!r}; known: "
                         f"{', '.join(PRIORITY_SOURCES)}")
    if trace is None:
        raise ValueError("--priority qos reads the trace's qos and time columns; it needs "
                         "--trace DIR (the synthetic default has neither)")
    if seeds is not None or plot is not None or tune != DEFAULT_TUNE:
        raise ValueError("--priority replays the trace's own timeline (no inflation, no "
                         "shuffle, no curve): leave out --seeds, --tune and --plot")


def workload_status(pods: Sequence[TracePod], capacity_milli: int, tune: float) -> str:
    """The workload part of the line under the table: the trace pods are inflated to
    ``tune`` x the cluster's GPU capacity (``capacity_milli``, milli-GPU) only when they
    ask for less (:func:`hami.sim.workload.inflate` never drops pods), e.g. for a
    ``--nodes`` cluster smaller than the trace's."""
    demand = gpu_demand(pods) / capacity_milli if capacity_milli else 0.0
    if demand >= tune:
        return (f"{len(pods)} trace pods asking for {demand:.3g}x capacity (not inflated: "
                f"more than --tune {tune:g})")
    return f"{len(pods)} trace pods inflated to {tune:g}x capacity"


def simulate(
    trace: Annotated[Path | None, typer.Option(
        "--trace", envvar=TRACE_ENV, help="Directory of the Alibaba GPU trace's openb "
        "CSVs: the folder cluster-trace-gpu-v2023/csv of the alibaba/clusterdata repository "
        "on GitHub (about 15 MB, not shipped with hami; the README says how to get it). "
        "Omit to run the embedded synthetic openb-like default.", file_okay=False)] = None,
    nodes_file: Annotated[Path | None, typer.Option(
        "--nodes", help="Node list CSV replacing the trace's (or the synthetic) cluster: "
        "sn,cpu_milli,memory_mib,gpu,model[,mode]; mode hami-core (default) or mig "
        f"(MIG-capable models: {', '.join(m.name for m in MIG_MODELS)}). See docs/simulate.md.",
        dir_okay=False)
    ] = None,
    workload: Annotated[str, typer.Option(
        help="Pod list of the trace: default, gpushare100, multigpu50, gpuspec25, ...")
    ] = "default",
    seeds: Annotated[str | None, typer.Option(
        help="Seeds: '42', '42,43' or '42-51' (the paper's). Default: one seed (42 for a "
        "trace, 0 for the synthetic default). Every seed replays every policy, a few "
        "seconds each on the trace (the s/run column): '42-51' takes minutes.")] = None,
    policies: Annotated[str, typer.Option(
        help="'all', 'paper' (the FGD paper's six schedulers and ours) or a comma list of: "
        f"{', '.join(PAPER_POLICIES)} (the paper's, on its resource model), "
        "<node>/<gpu> HAMi policies (node: binpack, spread; gpu: binpack, spread, "
        "topology-aware, mutex), fragmentation-aware (ours) and "
        "fragmentation-aware+lookahead (ours with a one-arrival look-ahead: the near-best "
        "nodes re-ranked by the next arrival's expected fragmentation growth, on task "
        "mixes with whole-GPU demand and few GPU-type constraints; only when named, never "
        "in 'all' or 'paper').")] = "all",
    split_count: Annotated[int, typer.Option(
        "--split-count", help=f"Tasks per GPU (deviceSplitCount), at least {MIN_SPLIT_COUNT}"
        " (the trace's smallest share is 5 %).")] = DEFAULT_SPLIT_COUNT,
    tune: Annotated[float, typer.Option(
        help="Inflate the workload until requested GPU reaches tune x capacity (above 0, "
             "at most 10).")
    ] = DEFAULT_TUNE,
    scale: Annotated[float, typer.Option(
        help="Synthetic default only: size relative to the trace.")] = DEFAULT_SCALE,
    json_out: Annotated[bool, typer.Option(
        "--json", help="Print a JSON document (schema hami.simulate/v1) instead of the "
        "table.")] = False,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="Write unallocated GPU percent vs arrived demand to this PNG.",
        dir_okay=False)] = None,
    progress_bar: Annotated[bool, typer.Option(
        "--progress/--no-progress", help="Show a progress bar on stderr.")] = True,
    mode: Annotated[str, typer.Option(
        help="extender (the policies as listed) or dra: also DRA mode, as row "
        f"{FRAGMENTATION_AWARE_DRA} next to {FRAGMENTATION_AWARE} (added if not listed): "
        "hami's fragmentation-aware node order from /prioritize (the same scorer), and "
        "inside the node the first card that fits, as kube-scheduler's DRA allocator "
        "takes it.")] = "extender",
    priority: Annotated[str | None, typer.Option(
        "--priority", help="qos: replay the trace's own timeline instead (pods arrive at "
        "creation_time and hold their slice for their run time, deletion_time minus "
        "scheduled_time), with spec.priority from the trace's qos column ("
        + ", ".join(f"{q} {p}" for q, p in QOS_PRIORITY.items()) + "), once without and "
        "once with preemption (hami's, the extender's core function; evicted pods are "
        "re-created at once and queue again), and report LS pods' pending time (seconds), LS pods "
        "never placed, BE pods evicted and the mean GPU allocation, per HAMi policy (the "
        "paper's schedulers have no priorities). Needs --trace and an 11-column pod list; "
        "no --seeds, --tune or --plot (no inflation, no shuffle). Off by default.")
    ] = None,
) -> None:
    """Replay a cluster trace through admission, filter/score and bind, and report how
    well each policy packs GPUs (unallocated GPU % vs arrived demand, as in Weng et al.,
    USENIX ATC'23). The table's columns are described below; --json has the same values
    (schema hami.simulate/v1). With MIG-mode nodes (--nodes) a second table shows how the
    MIG GPUs are used at 100 % arrived demand."""
    err = Console(stderr=True)
    try:
        if plot is not None and not plot.resolve().parent.is_dir():
            raise ValueError(f"--plot: directory {plot.resolve().parent} does not exist")
        if trace is None and workload != "default":
            raise ValueError("--workload selects a trace file; it needs --trace DIR")
        policy_list = with_mode(parse_policies(policies), mode)
        if priority is not None:
            _check_priority(priority, trace, seeds, plot, tune)
        if split_count < MIN_SPLIT_COUNT:
            raise ValueError(f"--split-count must be at least {MIN_SPLIT_COUNT}, "
                             f"got {split_count}")
        # Written so that NaN fails too; an infinite --tune inflated the pod list forever.
        if not 0 < tune <= MAX_TUNE:
            raise ValueError(f"--tune must be above 0 and at most {MAX_TUNE:g} "
                             f"(the paper's 1.3 is the default), got {tune:g}")
        if not 0 < scale <= 4:
            raise ValueError(f"--scale must be above 0 and at most 4, got {scale:g}")
        nodes: list[TraceNode]
        pods: list[TracePod]
        reference: dict[str, dict[int, float]] = {}
        settings: dict[str, Any]
        if trace is not None:
            if nodes_file is not None:  # the trace's own node list is not needed
                if not trace.is_dir():
                    raise TraceError(f"trace directory not found: {trace}")
                nodes, pods = [], load_pods(pod_file(trace, workload))
            else:  # the paper's figures are for the trace's own cluster only
                nodes, pods = load_trace(trace, workload)
                reference = load_reference(trace, workload)
            seed_list = parse_seeds(seeds or "42")
            settings = {"source": "trace", "trace": str(trace), "workload": workload,
                        "scale": None}
            title = f"hami simulate: {workload} ({trace})"
        else:
            nodes, pods = synthetic_trace(scale, DEFAULT_SEED)
            seed_list = parse_seeds(seeds or "0")
            settings = {"source": "synthetic", "trace": None, "workload": "synthetic-openb",
                        "scale": scale}
            title = f"hami simulate: synthetic openb-like cluster (scale {scale:g})"
        if nodes_file is not None:
            nodes = load_nodes(nodes_file)
            if not any(n.gpu for n in nodes):
                raise ValueError(f"--nodes: {nodes_file} has no GPU node")
            settings["node_file"] = str(nodes_file)
            title += f", nodes from {nodes_file.name}"
        if any(n.mode == "mig" for n in nodes):  # the paper's model has no MIG
            asked = [p for p in policy_list if p in PAPER_POLICIES]
            if asked and policies.strip() not in ("", "all", "paper"):
                raise ValueError(f"{', '.join(asked)}: the paper's schedulers do not model "
                                 "MIG-mode nodes")
            policy_list = [p for p in policy_list if p not in PAPER_POLICIES]
        timed: list[TimedPod] = []
        if priority is not None:
            timed = timed_pods(pods)
            asked = [p for p in policy_list if p in PAPER_POLICIES]
            if asked and policies.strip() not in ("", "all", "paper"):
                raise ValueError(f"{', '.join(asked)}: the paper's schedulers have no "
                                 "priorities; --priority runs HAMi's policies and ours")
            policy_list = [p for p in policy_list if p not in PAPER_POLICIES]
    except (TraceError, ValueError) as exc:
        message = str(exc)
        if trace is not None and isinstance(exc, TraceError) and "not found" in message:
            message += f" ({TRACE_HINT})"
        err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
    if priority is not None:
        settings.update({"priority": priority, "policies": policy_list,
                         "split_count": split_count, "nodes": len(nodes),
                         "gpus": sum(n.gpu for n in nodes), "trace_pods": len(pods)})
        priority_report.run_cli(nodes, pods, timed, policy_list, split_count, settings,
                                f"{title}, priorities from qos", json_out, progress_bar)
        return
    sim = Simulation(nodes, pods, policy_list, seed_list, split_count, tune)
    settings.update({"seeds": seed_list, "policies": policy_list, "split_count": split_count,
                     "tune": tune, "nodes": len(nodes), "gpus": sum(n.gpu for n in nodes),
                     "trace_pods": len(pods)})
    mig_gpus = sum(n.gpu for n in nodes if n.mode == "mig")
    if mig_gpus:
        settings["mig_gpus"] = mig_gpus
    show = progress_bar and (err.is_terminal or not json_out)
    if show:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err, transient=True) as progress:
            results = sim.run(progress)
    else:
        results = sim.run()
    points = list(REPORT_POINTS)
    summary = metrics.summarize(results, points)
    if json_out:
        doc = report.to_json(settings, summary, results, points, reference)
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        out = Console() if Console().is_terminal else Console(width=140)
        report.render_table(summary, points, title, reference, console=out)
        report.render_mig_table(summary, console=out)
        out.print(f"{len(nodes)} nodes, {settings['gpus']} GPUs, "
                  f"{workload_status(pods, sim.capacity_milli, tune)}; "
                  f"seeds {', '.join(map(str, seed_list))}; split count {split_count}"
                  + (f"; {mig_gpus} GPUs in MIG mode." if mig_gpus else "."), soft_wrap=True)
    if plot is not None:
        path = report.write_plot(plot, summary, title, reference)
        err.print(f"plot written to {path}")


simulate.__doc__ = (f"{inspect.cleandoc(simulate.__doc__ or '')}\n\nThe table's columns:\n\n"
                    f"{report.columns_help()}\n\nWith --priority qos, the table's columns:"
                    f"\n\n{priority_report.columns_help()}")
