"""``promtool check metrics`` on the /metrics served over HTTP by a running ``hami monitor``
(a real process, container cache files written at the documented layout, pods from the
test apiserver), and which pods and containers it reports as their statuses change. The
scheduler's served /metrics is checked by test_quickstart."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType
from prometheus_client.parser import text_string_to_metric_families

from hami.testing.controlplane import ControlPlane, wait_until
from hami.testing.processes import free_port
from tests.deploy.test_metrics import promtool

pytestmark = pytest.mark.e2e


def _port() -> int:
    return free_port()  # outside the ephemeral range: no client connection takes it


def _scrape(port: int) -> bytes:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return bytes(r.read())
    except OSError:
        return b""


@contextlib.contextmanager
def _monitor(control_plane: ControlPlane, hook: Path, node: str, log_path: Path,
             resync: str = "5m") -> Iterator[tuple[int, Callable[[], None]]]:
    """A real ``hami monitor`` process; yields its port and a liveness check."""
    port = _port()
    env = {**os.environ, "HOOK_PATH": str(hook), "NODE_NAME": node,
           "HAMI_RESYNC_INTERVAL": resync}
    log = open(log_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-c", "import typer; from hami.monitor.command import monitor; "
         "typer.run(monitor)", f"--metrics-bind-address=127.0.0.1:{port}",
         f"--kubeconfig={control_plane.kubeconfig}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def alive() -> None:
        if proc.poll() is not None:
            raise AssertionError(log_path.read_text()[-3000:])

    try:
        yield port, alive
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


GPU = "GPU-aaaaaaaa-1111-2222-3333-444444444444"


def _granted(*containers: str) -> dict[str, str]:
    """The scheduler's allocation annotation granting :data:`GPU` to each container (the
    monitor reports only granted GPUs)."""
    from tests.node.regionfile import allocated

    return allocated(*((GPU,) for _ in containers))


def _cache_dir(hook: Path, uid: str, container: str, used_bytes: int) -> Path:
    from tests.node.regionfile import Proc, RegionSpec, build

    d = hook / "containers" / f"{uid}_{container}"
    d.mkdir(parents=True)
    (d / "libvgpu.so").touch()
    (d / "0a1b.cache").write_bytes(build(RegionSpec(
        uuids=(GPU,), limits={0: 3000 << 20},
        last_kernel_time=int(time.time()) - 5,
        procs=[Proc(pid=10, used={0: (100 << 20, 0, used_bytes - (100 << 20), 0, used_bytes)},
                    sm_util={0: 30})])))
    return d


def test_monitor_serves_promtool_clean_metrics(control_plane: ControlPlane, kube_client: Any,
                                               tmp_path: Path) -> None:
    pytest.importorskip("hami.monitor.command")

    node = f"mon-{uuid.uuid4().hex[:6]}"
    name = f"gpu-user-{uuid.uuid4().hex[:6]}"
    pod = kube_client.create(Pod(
        metadata=ObjectMeta(name=name, namespace="default", labels={"hami.io/vgpu-node": node},
                            annotations=_granted("main")),
        spec=PodSpec(nodeName=node, containers=[Container(name="main", image="x")])))
    hook = tmp_path / "vgpu"
    _cache_dir(hook, pod.metadata.uid, "main", 1000 << 20)
    try:
        with _monitor(control_plane, hook, node, tmp_path / "monitor.log") as (port, alive):
            wait_until(lambda: b"hami_vgpu_memory_used_bytes{" in _scrape(port), timeout_s=60,
                       what="monitor container metrics", alive=alive)
            text = _scrape(port)
        result = promtool(text)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f'pod="{name}"'.encode() in text and b'container="main"' in text
        assert b"hami_vgpu_memory_limit_bytes{" in text
    finally:
        kube_client.delete(Pod, name, namespace="default", grace_period=0)


def _container_status(name: str, state: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "image": "x", "imageID": "", "ready": "running" in state,
            "restartCount": 0, "state": state}


def test_monitor_reports_running_containers_only(control_plane: ControlPlane, kube_client: Any,
                                                 tmp_path: Path) -> None:
    """Pod statuses as a kubelet writes them: a Succeeded pod has no series but keeps its
    directory until it is deleted; in a Running pod a terminated sidecar has none."""
    node = f"mon-{uuid.uuid4().hex[:6]}"
    tag = uuid.uuid4().hex[:6]
    labels = {"hami.io/vgpu-node": node}
    busy, done = f"busy-{tag}", f"done-{tag}"
    hook = tmp_path / "vgpu"
    run = {"running": {"startedAt": "2025-01-01T00:00:00Z"}}
    term = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    pods = {}
    for name, ctrs in ((busy, ("main", "side")), (done, ("main",))):
        pods[name] = kube_client.create(Pod(
            metadata=ObjectMeta(name=name, namespace="default", labels=labels,
                                annotations=_granted(*ctrs)),
            spec=PodSpec(nodeName=node, containers=[Container(name=c, image="x") for c in ctrs])))
    busy_main = _cache_dir(hook, pods[busy].metadata.uid, "main", 1000 << 20)
    busy_side = _cache_dir(hook, pods[busy].metadata.uid, "side", 2000 << 20)
    done_main = _cache_dir(hook, pods[done].metadata.uid, "main", 3000 << 20)
    kube_client.patch(Pod.Status, busy, {"status": {"phase": "Running", "containerStatuses": [
        _container_status("main", run), _container_status("side", term)]}},
        namespace="default", patch_type=PatchType.MERGE)
    kube_client.patch(Pod.Status, done, {"status": {"phase": "Succeeded", "containerStatuses": [
        _container_status("main", term)]}}, namespace="default", patch_type=PatchType.MERGE)
    try:
        with _monitor(control_plane, hook, node, tmp_path / "monitor.log",
                      resync="1s") as (port, alive):
            wait_until(lambda: f'pod="{busy}"'.encode() in _scrape(port), timeout_s=60,
                       what="the running pod's series", alive=alive)
            text = _scrape(port).decode()
            used = {(s.labels["pod"], s.labels["container"]): s.value
                    for fam in text_string_to_metric_families(text) for s in fam.samples
                    if s.name == "hami_vgpu_memory_used_bytes"}
            assert used == {(busy, "main"): 1000 << 20}
            assert 'container="side"' not in text
            assert f'pod="{done}"' not in text
            assert done_main.is_dir() and busy_side.is_dir()
            kube_client.delete(Pod, done, namespace="default", grace_period=0)
            wait_until(lambda: not done_main.exists(), timeout_s=60,
                       what="the deleted pod's directory to be removed", alive=alive)
            assert busy_main.is_dir() and busy_side.is_dir()
            assert f'pod="{busy}"'.encode() in _scrape(port)
    finally:
        for name in pods:
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, name, namespace="default", grace_period=0)
