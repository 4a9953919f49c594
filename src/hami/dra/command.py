"""``hami dra-plugin``: the DRA node agent (ResourceSlice + kubelet DRA plugin)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated

import typer

from hami.cliargs import choose
from hami.deviceplugin.command import (
    BackendOption,
    DeviceConfigOption,
    FakeInventoryOption,
    HookPathOption,
    KubeconfigOption,
    NodeConfigOption,
    NodeNameOption,
)
from hami.deviceplugin.discovery import BACKENDS
from hami.durations import seconds


def dra_plugin(
    node_name: NodeNameOption = "",
    hook_path: HookPathOption = "/usr/local",
    config_file: DeviceConfigOption = None,
    node_config_file: NodeConfigOption = Path("/config/config.json"),
    backend: BackendOption = "nvml",
    fake_inventory: FakeInventoryOption = None,
    kubeconfig: KubeconfigOption = None,
    registry_dir: Annotated[Path, typer.Option(help="kubelet plugin registry directory")] = Path(
        "/var/lib/kubelet/plugins_registry"),
    plugin_dir: Annotated[Path, typer.Option(help="directory of the DRA socket")] = Path(
        "/var/lib/kubelet/plugins/gpu.hami.io"),
    cdi_dir: Annotated[Path, typer.Option(help="CDI spec directory of the runtime")] = Path(
        "/var/run/cdi"),
    publish_interval: Annotated[float, typer.Option(
        parser=seconds, metavar="DURATION",
        help="time between card discoveries (10s, or seconds: 10); the Node is watched, "
             "cordon changes republish at once", show_default="10s")] = 10.0,
    kubelet_plugin: Annotated[bool, typer.Option(
        help="serve the kubelet DRA plugin sockets (--no-kubelet-plugin: publish only)")] = True,
) -> None:
    """DRA mode node agent: publish this node's GPUs as one ResourceSlice and prepare
    claims for the kubelet (CDI specs with HAMi-core's limits)."""
    from hami import __version__
    from hami.deviceplugin.config import apply_node_config, from_device_config
    from hami.deviceplugin.discovery import open_backend
    from hami.deviceplugin.kube import make_client
    from hami.dra.kubeletplugin import PluginPaths
    from hami.dra.node import DraAgent, run_agent, settings_for
    from hami.dra.startup import refusal

    choose(backend, BACKENDS, "--backend")  # before any file, socket or API server
    if not node_name:
        typer.echo("error: NODE_NAME is required", err=True)
        raise typer.Exit(2)
    try:
        cfg = from_device_config(config_file.read_text() if config_file else None)
        if node_config_file.exists():
            cfg = apply_node_config(cfg, node_config_file.read_text(), node_name)
        client = make_client(kubeconfig)
        reason = refusal(client, node_name, mig=cfg.operating_mode == "mig")
        if reason:
            typer.echo(f"error: {reason}", err=True)
            raise typer.Exit(1)
        agent = DraAgent(node_name, open_backend(backend, fake_inventory), cfg, client)
        run_agent(agent, PluginPaths(registry_dir, plugin_dir, cdi_dir),
                  settings_for(hook_path, __version__), stop=threading.Event(),
                  publish_interval_s=publish_interval, kubelet_plugin=kubelet_plugin,
                  install_signals=True)
    except typer.Exit:
        raise
    except Exception as exc:  # noqa: BLE001 - report and exit non-zero
        from hami.kubehint import kube_hint

        typer.echo(f"error: {kube_hint(exc) or exc}", err=True)
        raise typer.Exit(1) from None
