"""The ``hami`` command: one entry point for every component."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="hami: GPU sharing for Kubernetes, wire-compatible with HAMi.",
                  no_args_is_help=True, add_completion=False)


class Output(StrEnum):
    """Output formats of ``hami schedule``."""

    json = "json"
    table = "table"


@app.callback()
def main() -> None:
    """hami: GPU sharing for Kubernetes, wire-compatible with HAMi v2.10."""


@app.command("schedule")
def schedule_command(
    file: Annotated[Path, typer.Option("-f", "--file", help="YAML/JSON stream of Nodes, Pods, "
                                       "ResourceQuotas ('-' for stdin)")],
    device_config: Annotated[Path | None, typer.Option(help="HAMi device-config.yaml")] = None,
    node_policy: Annotated[str, typer.Option(help="binpack | spread | fragmentation-aware")] = "binpack",
    gpu_policy: Annotated[str, typer.Option(help="spread | binpack | topology-aware | mutex | "
                                            "fragmentation-aware")] = "spread",
    scheduler_name: Annotated[str, typer.Option(help="schedulerName the webhook sets")] = "hami-scheduler",
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
    enable_ascend: Annotated[bool, typer.Option(help="register the device config's vnpus (Ascend) vendors")] = False,
    enable_iluvatar: Annotated[bool, typer.Option(help="register the device config's iluvatars vendors")] = False,
) -> None:
    """Dry-run admission and scheduling of the pending pods in a cluster file."""
    from hami.core.config import GPU_POLICIES, NODE_POLICIES, ConfigError
    from hami.offline import InputError, load_objects, schedule
    from hami.settings import scheduler_config

    if node_policy not in NODE_POLICIES:
        typer.echo(f"error: --node-policy must be one of {', '.join(NODE_POLICIES)}, "
                   f"got {node_policy!r}", err=True)
        raise typer.Exit(2)
    bad = [p for p in gpu_policy.split(",") if p.strip() not in (*GPU_POLICIES, "numa")]
    if bad:
        typer.echo(f"error: --gpu-policy entries must be among {', '.join(GPU_POLICIES)}, numa; "
                   f"got {', '.join(map(repr, bad))}", err=True)
        raise typer.Exit(2)
    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text()
        config = scheduler_config(device_config, node_policy, gpu_policy, scheduler_name,
                                  enable_ascend=enable_ascend, enable_iluvatar=enable_iluvatar)
        report = schedule(load_objects(text), config)
    except (OSError, InputError, ConfigError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if output is Output.json:
        typer.echo(json.dumps(report, indent=2, sort_keys=False))
        return
    _print_table(report)


def _print_table(report: dict) -> None:  # type: ignore[type-arg]
    from rich.console import Console
    from rich.table import Table

    table = Table(title="hami schedule (dry run)")
    for col in ("pod", "admission", "node", "devices / reason"):
        table.add_column(col, overflow="fold")
    for pod in report["pods"]:
        adm = pod["admission"]
        verdict = "allowed" if adm["allowed"] else f"denied: {adm['message']}"
        if pod["node"]:
            detail = "\n".join(f"{k.removeprefix('hami.io/')}={v}"
                               for k, v in pod["annotations"].items()
                               if k.endswith("-allocated") and v) or "-"
        else:
            detail = pod["error"] or "; ".join(f"{n}: {r}" for n, r in pod["failed_nodes"].items())
        table.add_row(f"{pod['namespace']}/{pod['name']}", verdict, pod["node"] or "-", detail)
    console = Console()
    console.print(table)
    for name, why in report["nodes"].items():
        if why:
            console.print(f"node {name} not registered: {why}", soft_wrap=True)
    for name, why in report.get("node_warnings", {}).items():
        console.print(f"node {name} registered without some devices: {why}", soft_wrap=True)


def _register() -> None:
    """The component commands; each module imports its heavy libraries lazily or is small."""
    from hami.certgen import certgen
    from hami.deviceplugin.command import device_plugin
    from hami.monitor.command import monitor
    from hami.scheduler.command import scheduler
    from hami.sim.command import simulate
    from hami.top import top

    app.command("scheduler")(scheduler)
    app.command("device-plugin")(device_plugin)
    app.command("monitor")(monitor)
    app.command("top")(top)
    app.command("certgen")(certgen)
    app.command("simulate")(simulate)


_register()

if __name__ == "__main__":
    app()
