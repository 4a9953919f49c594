"""``promtool check metrics`` on the /metrics served over HTTP by a running ``hami monitor``
(a real process, container cache files written at the documented layout, pods from the
test apiserver). The scheduler's served /metrics is checked by test_quickstart."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from hami.testing.controlplane import ControlPlane, wait_until
from tests.deploy.test_metrics import promtool

pytestmark = pytest.mark.e2e


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> bytes:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return bytes(r.read())
    except OSError:
        return b""


def test_monitor_serves_promtool_clean_metrics(control_plane: ControlPlane, kube_client: Any,
                                               tmp_path: Path) -> None:
    pytest.importorskip("hami.monitor.command")
    from tests.node.regionfile import Proc, RegionSpec, build

    node = f"mon-{uuid.uuid4().hex[:6]}"
    name = f"gpu-user-{uuid.uuid4().hex[:6]}"
    pod = kube_client.create(Pod(
        metadata=ObjectMeta(name=name, namespace="default", labels={"hami.io/vgpu-node": node}),
        spec=PodSpec(nodeName=node, containers=[Container(name="main", image="x")])))
    hook = tmp_path / "vgpu"
    d = hook / "containers" / f"{pod.metadata.uid}_main"
    d.mkdir(parents=True)
    (d / "libvgpu.so").touch()
    (d / "0a1b.cache").write_bytes(build(RegionSpec(
        uuids=("GPU-aaaaaaaa-1111-2222-3333-444444444444",), limits={0: 3000 << 20},
        last_kernel_time=int(time.time()) - 5,
        procs=[Proc(pid=10, used={0: (100 << 20, 0, 900 << 20, 0, 1000 << 20)},
                    sm_util={0: 30})])))
    port = _port()
    env = {**os.environ, "HOOK_PATH": str(hook), "NODE_NAME": node,
           "HAMI_RESYNC_INTERVAL": "5m"}
    log = open(tmp_path / "monitor.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-c", "import typer; from hami.monitor.command import monitor; "
         "typer.run(monitor)", f"--metrics-bind-address=127.0.0.1:{port}",
         f"--kubeconfig={control_plane.kubeconfig}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def alive() -> None:
            if proc.poll() is not None:
                raise AssertionError((tmp_path / "monitor.log").read_text()[-3000:])

        wait_until(lambda: b"hami_vgpu_memory_used_bytes{" in _scrape(port), timeout_s=60,
                   what="monitor container metrics", alive=alive)
        text = _scrape(port)
        result = promtool(text)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f'pod="{name}"'.encode() in text and b'container="main"' in text
        assert b"hami_vgpu_memory_limit_bytes{" in text
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        kube_client.delete(Pod, name, namespace="default", grace_period=0)
