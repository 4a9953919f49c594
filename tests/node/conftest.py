"""Fixtures: a running device plugin (fake GPU backend) in front of a fake kubelet."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


@contextlib.contextmanager
def plugin_on_api(kube_client: Any, node: str, gpus: int, inventory: dict[str, Any],
                  replicas: int, **start: Any) -> Iterator[PluginHarness]:
    """A plugin on the fake inventory against a real API server (``kube_client``): the
    default namespace's pods deleted, ``node`` recreated with ``gpus`` advertised, the
    plugin started with ``start`` (see :func:`start_plugin`; the MIG apply lock under the
    harness root unless given) and registered with the fake
    kubelet showing ``replicas`` devices; stopped on exit."""
    from lightkube.resources.core_v1 import Node, Pod

    from hami.deviceplugin.kube import KubeApi
    from hami.testing.controlplane import create_gpu_node

    for p in kube_client.list(Pod, namespace="default"):
        kube_client.delete(Pod, p.metadata.name, namespace="default", grace_period=0)
    with contextlib.suppress(Exception):  # absent on the first run
        kube_client.delete(Node, node)
    create_gpu_node(kube_client, node, gpus=gpus)
    root = short_tmpdir()
    h = PluginHarness(root=root, inventory=root / "inv.yaml", kubelet=FakeKubelet(root / "dp"),
                      kube=KubeApi(kube_client), hook_path=root / "hook",  # type: ignore[arg-type]
                      lock_dir=root / "vgpulock", stop=threading.Event())
    h.write_inventory(inventory)
    h.kubelet.start()
    start.setdefault("mig_apply_lock", root / "hami" / "hami-mig-apply.lock")
    start_plugin(h, register_interval_s=0.5, **start)
    h.kubelet.wait_registered()
    h.kubelet.wait_list(lambda d: len(d) == replicas)
    try:
        yield h
    finally:
        h.stop.set()
        if h.thread is not None:
            h.thread.join(timeout=10)
        h.kubelet.stop()
