"""``hami schedule``: the offline dry run of admission and scheduling, for people."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from hami.cliargs import choose, completer
from hami.scheduler.defaultopts import DefaultCores, DefaultGpu, DefaultMem


class Output(StrEnum):
    """Output formats of ``hami schedule``."""

    json = "json"
    table = "table"


def schedule_command(
    file: Annotated[Path, typer.Option("-f", "--file", help="YAML/JSON stream of Nodes, Pods, "
                                       "ResourceQuotas ('-' for stdin)")],
    device_config_file: Annotated[Path | None, typer.Option(
        "--device-config-file", help="HAMi device-config.yaml")] = None,
    node_scheduler_policy: Annotated[str, typer.Option(
        "--node-scheduler-policy", help="binpack | spread | fragmentation-aware")] = "binpack",
    gpu_scheduler_policy: Annotated[str, typer.Option(
        "--gpu-scheduler-policy", help="spread | binpack | topology-aware | mutex | "
        "fragmentation-aware | numa, or a comma list (numa,binpack)")] = "spread",
    scheduler_name: Annotated[str, typer.Option(help="schedulerName the webhook sets")] = "hami-scheduler",
    high_priority_namespaces: Annotated[str, typer.Option(
        help="namespaces whose GPU pods may ask for nvidia.com/priority 0, a,b (as the hami "
             "scheduler's flag; default: none)")] = "",
    output: Annotated[str, typer.Option(
        "-o", "--output", help="a human-readable table, or one JSON document",
        metavar="[" + "|".join(Output) + "]",
        autocompletion=completer(list(Output)))] = Output.table.value,
    enable_ascend: Annotated[bool, typer.Option(
        help="schedule Ascend NPUs: the chips of the device config's vnpus section")] = False,
    enable_iluvatar: Annotated[bool, typer.Option(
        help="schedule Iluvatar GPUs: the chips of the device config's iluvatars "
             "section")] = False,
    default_mem: DefaultMem = None,
    default_cores: DefaultCores = None,
    default_gpu: DefaultGpu = None,
) -> None:
    """Dry-run admission and scheduling of the pending pods in a cluster file."""
    from dataclasses import replace

    from hami.core.config import GPU_POLICIES, NODE_POLICIES, ConfigError
    from hami.offline import InputError, load_objects, schedule
    from hami.settings import scheduler_config

    fmt = Output(choose(output, list(Output), "-o/--output"))
    if node_scheduler_policy not in NODE_POLICIES:
        typer.echo(f"error: --node-scheduler-policy must be one of {', '.join(NODE_POLICIES)}, "
                   f"got {node_scheduler_policy!r}", err=True)
        raise typer.Exit(2)
    bad = [p for p in gpu_scheduler_policy.split(",") if p.strip() not in (*GPU_POLICIES, "numa")]
    if bad:
        typer.echo(f"error: --gpu-scheduler-policy entries must be among "
                   f"{', '.join(GPU_POLICIES)}, numa; got {', '.join(map(repr, bad))}", err=True)
        raise typer.Exit(2)
    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text()
    except OSError as exc:
        typer.echo(f"error: cannot read -f {file}: {exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None
    except UnicodeDecodeError as exc:
        typer.echo(f"error: cannot read -f {file}: not UTF-8 text (byte {exc.start}); "
                   "give a YAML or JSON file", err=True)
        raise typer.Exit(2) from None
    try:
        config = scheduler_config(device_config_file, node_scheduler_policy,
                                  gpu_scheduler_policy, scheduler_name,
                                  enable_ascend=enable_ascend, enable_iluvatar=enable_iluvatar,
                                  default_memory_mib=default_mem,
                                  default_cores_percent=default_cores,
                                  default_gpu_num=default_gpu)
        config = replace(config, high_priority_namespaces=tuple(
            n.strip() for n in high_priority_namespaces.split(",") if n.strip()))
        objects = load_objects(text)
        report = schedule(objects, config)
    except (OSError, InputError, ConfigError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if fmt is Output.json:
        typer.echo(json.dumps(report, indent=2, sort_keys=False))
    elif report["pods"]:  # an empty table says nothing; the line below does
        print_table(report)
    if not report["pods"]:
        kinds = sorted({str(o.get("kind")) for o in objects})
        count = f"{len(objects)} object{'' if len(objects) == 1 else 's'}"
        typer.echo(f"{file}: no pending pods to schedule (the file holds "
                   f"{count}: {', '.join(kinds) or 'none'}); add Pods "
                   "without spec.nodeName", err=True)


def _patch_lines(patch: list[dict[str, Any]]) -> list[str]:
    lines = []
    for op in patch:
        value = op.get("value")
        shown = "" if "value" not in op else "=" + (value if isinstance(value, str)
                                                   else json.dumps(value, separators=(",", ":")))
        lines.append(f"{op.get('op')} {op.get('path')}{shown}")
    return lines


#: Narrower terminals get one block per pod instead of the table, whose columns would
#: break annotation values and patch paths in the middle of a token.
TABLE_MIN_COLUMNS = 120


def preemption_line(plan: dict[str, Any]) -> str:
    """What preemption would do for an unschedulable pod, in one line (not done)."""
    victims = ", ".join(f"{v['namespace']}/{v['name']} (priority {v['priority']})"
                        for v in plan["victims"])
    freed = ", ".join(f"{uuid} {f['memory_mib']} MiB, {f['cores_percent']}% cores, "
                      f"{f['slots']} slot(s)" for uuid, f in plan["freed_on_cards"].items())
    return (f"would preempt on {plan['node']} (card {', '.join(plan['cards'])}): evict "
            f"{victims}; frees {freed} (not done: dry run)")


def pod_label(pod: dict[str, Any]) -> str:
    """``namespace/name`` of a report's pod; for a pod without a name (the API server
    names it at creation) ``namespace/<generateName><generated>`` or
    ``namespace/<unnamed>``, with its place among the file's objects."""
    if pod["name"]:
        return f"{pod['namespace']}/{pod['name']}"
    name = f"{pod['generate_name']}<generated>" if pod.get("generate_name") else "<unnamed>"
    where = f" (object {pod['object_index']} of the file)" if pod.get("object_index") else ""
    return f"{pod['namespace']}/{name}{where}"


def _rows(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(pod, admission, node, devices / reason) per pod."""
    rows = []
    for pod in report["pods"]:
        adm = pod["admission"]
        verdict = "allowed" if adm["allowed"] else f"denied: {adm['message']}"
        if adm["allowed"] and adm.get("patch"):
            verdict += "\npatch:\n" + "\n".join(_patch_lines(adm["patch"]))
        if pod["node"]:
            node = pod["node"]
            detail = "\n".join(f"{k.removeprefix('hami.io/')}={v}"
                               for k, v in pod["annotations"].items()
                               if k.endswith("-allocated") and v) or "-"
        else:
            reasons = "; ".join(f"{n}: {r}" for n, r in pod["failed_nodes"].items())
            node = "unschedulable" if adm["allowed"] and not pod["error"] else "-"
            detail = pod["error"] or reasons or ("no node in the file" if node != "-" else "-")
            if pod.get("preemption"):
                detail += "\n" + preemption_line(pod["preemption"])
        rows.append((pod_label(pod), verdict, node, detail))
    return rows


def print_table(report: dict[str, Any]) -> None:
    """The report as a table: per pod its admission (verdict and the patch the webhook
    applies), its node (``unschedulable`` when no node fits) and its devices or why not.
    Below :data:`TABLE_MIN_COLUMNS` the same as one block per pod, each value on lines of
    its own and never broken inside a token (long ones run past the edge, so that they
    can be copied)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    if console.width < TABLE_MIN_COLUMNS:
        console.print("hami schedule (dry run)", soft_wrap=True)
        for name, verdict, node, detail in _rows(report):
            console.print(f"\npod {name}", soft_wrap=True, markup=False)
            for label, value in (("admission", verdict), ("node", node),
                                 ("devices / reason", detail)):
                lines = value.split("\n")
                console.print(f"  {label}: {lines[0]}", soft_wrap=True, markup=False)
                for line in lines[1:]:
                    console.print(f"    {line}", soft_wrap=True, markup=False)
    else:
        table = Table(title="hami schedule (dry run)")
        for col in ("pod", "admission", "node", "devices / reason"):
            table.add_column(col, overflow="fold")
        for row in _rows(report):  # the file's text, never rich markup
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)
    for name, why in report["nodes"].items():
        if why:
            console.print(f"node {name} not registered: {why}", soft_wrap=True,
                          markup=False)
    for name, why in report.get("node_warnings", {}).items():
        console.print(f"node {name} registered without some devices: {why}", soft_wrap=True,
                      markup=False)
