"""Fixtures: a running device plugin (fake GPU backend) in front of a fake kubelet."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from hami.deviceplugin.command import run_plugin
from tests.node.fakes import FakeKube, FakeKubelet

NODE = "node-a"


@dataclass
class PluginHarness:
    """A plugin thread, its kubelet, its API and its paths."""

    root: Path
    inventory: Path
    kubelet: FakeKubelet
    kube: FakeKube
    hook_path: Path
    lock_dir: Path
    stop: threading.Event
    thread: threading.Thread | None = None
    errors: list[BaseException] = field(default_factory=list)

    def write_inventory(self, data: dict) -> None:
        tmp = self.inventory.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(data))
        tmp.replace(self.inventory)


def short_tmpdir() -> Path:
    """Unix socket paths must stay under 108 bytes: use a short /tmp dir."""
    return Path(tempfile.mkdtemp(prefix="hn", dir="/tmp"))


def start_plugin(h: PluginHarness, config_yaml: str | None = None,
                 node_config: str | None = None, register_interval_s: float = 0.3,
                 node: str = NODE, **extra: object) -> None:
    cfg = None
    if config_yaml is not None:
        cfg = h.root / "device-config.yaml"
        cfg.write_text(config_yaml)
    ncfg = None
    if node_config is not None:
        ncfg = h.root / "config.json"
        ncfg.write_text(node_config)

    def target() -> None:
        try:
            run_plugin(node_name=node, hook_path=str(h.hook_path), plugin_dir=h.kubelet.dir,
                       kubelet_socket=h.kubelet.socket, config_file=cfg, node_config_file=ncfg,
                       backend_kind="fake", fake_inventory=h.inventory, kubeconfig=None,
                       lock_dir=str(h.lock_dir), register_interval_s=register_interval_s,
                       stop=h.stop, kube_api=h.kube, **extra)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - surfaced by the test
            h.errors.append(exc)

    h.thread = threading.Thread(target=target, daemon=True)
    h.thread.start()


DEFAULT_INVENTORY = {"gpus": [
    {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 1, "numa": 0,
     "uuids": ["GPU-aaaaaaaa-1111-2222-3333-444444444444"]},
    {"model": "Tesla T4", "memory_mib": 15360, "count": 1, "numa": 1,
     "uuids": ["GPU-bbbbbbbb-1111-2222-3333-444444444444"]},
]}


@pytest.fixture
def harness() -> Iterator[PluginHarness]:
    root = short_tmpdir()
    kubelet = FakeKubelet(root / "dp")
    kube = FakeKube()
    kube.add_node(NODE)
    h = PluginHarness(root=root, inventory=root / "inv.yaml", kubelet=kubelet, kube=kube,
                      hook_path=root / "hook", lock_dir=root / "vgpulock", stop=threading.Event())
    h.write_inventory(DEFAULT_INVENTORY)
    kubelet.start()
    try:
        yield h
    finally:
        h.stop.set()
        if h.thread is not None:
            h.thread.join(timeout=10)
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
