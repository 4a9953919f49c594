"""hami on a real node: the whole chain with no GPU, for tests and ``make cluster NODE=real``.

:class:`GpuBed` starts, in order:

1. a :class:`~hami.testing.controlplane.ControlPlane` (etcd, kube-apiserver, the default
   kube-scheduler);
2. ``hami scheduler`` (extender + admission webhook, HTTPS with a throw-away CA), its
   MutatingWebhookConfiguration (CREATE pods, failurePolicy Fail, as the chart's), and a
   second kube-scheduler whose ``hami-scheduler`` profile calls its ``/filter`` and
   ``/bind``; allocations are signed with a key shared with the device plugin;
3. a :class:`~hami.testing.node.RealNode` (containerd + kubelet) with the pause and GPU
   test images of :mod:`hami.testing.images`;
4. inside the node's mount namespace, ``hami device-plugin`` on the fake GPU backend
   (an inventory YAML: the node's "GPUs") with libvgpu installed in its hook path, and
   ``hami monitor`` reading the containers' cache files.

GPU pods use :func:`gpu_test_pod`: the test image, where the stub CUDA driver plays the
card. The stub keeps its device state in a file on the node (``STUB_DIR``, a hostPath),
so every container on the node shares one "physical" GPU set, as containers share a real
one; libvgpu preloaded by ``/etc/ld.so.preload`` enforces the slice exactly as on a GPU.
"""

from __future__ import annotations

import os
import secrets
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hami.testing import images
from hami.testing.controlplane import (
    HOST,
    Component,
    ControlPlane,
    SchedulerHandle,
    ensure_namespace,
    free_port,
)
from hami.testing.gpupods import (  # noqa: F401 - re-exported for tests
    STUB_DIR,
    gpu_test_pod,
    stub_uuid,
    wait_pod_done,
    wait_webhook_serving,
    webhook_configuration,
)
from hami.testing.node import RealNode, ensure_root_ca
from hami.testing.pki import CertificateAuthority
from hami.testing.scheduler_config import ExtenderConfig

SCHEDULER_NAME = "hami-scheduler"
#: The device plugin's log line when a kubelet's ListAndWatch stream gets its first
#: device list: from then on the kubelet admits GPU pods with the plugin's devices.
WATCHING_LINE = "ListAndWatch: the kubelet is watching"
REPO = Path(__file__).resolve().parents[3]


def default_inventory(gpus: int = 2, memory_mib: int = 16384) -> dict[str, Any]:
    """A fake-backend inventory of ``gpus`` identical cards (``memory_mib`` each) with
    the stub driver's UUIDs, so the device plugin advertises the cards the containers'
    driver shows."""
    return {"gpus": [{"model": "NVIDIA A100-PCIE-16GB", "memory_mib": memory_mib, "numa": 0,
                      "uuids": [stub_uuid(i)]} for i in range(gpus)]}


class GpuBed:
    """Control plane + hami scheduler/webhook + one real node with hami's node agents.

    Args:
        workdir: everything (logs under ``logs/``, the node under ``node/``); a short
            temp dir by default.
        node_name: the Node's name.
        inventory: the fake GPUs (see :func:`default_inventory`).
        plugin_args, scheduler_args: extra arguments for ``hami device-plugin`` and
            ``hami scheduler``.
        device_config: HAMi's device-config YAML for both (``--device-config-file``).
        node_config: the per-node JSON override of the device plugin (HAMi's
            ``config.json``: ``{"nodeconfig": [{"name": ..., "operatingmode": ...}]}``).
        libvgpu_build: ``native/libvgpu/build`` (``make native``).
        keep_workdir: keep the temp work dir at :meth:`stop` (also ``HAMI_KEEP_WORKDIR=1``;
            it is always kept when :meth:`start` failed).

    Raises:
        NodeUnavailable: from :meth:`start` when this machine cannot run a node.
        ControlPlaneError: a process died or did not become ready.
    """

    def __init__(self, workdir: Path | None = None, *, node_name: str = "gpu-node-0",
                 inventory: Mapping[str, Any] | None = None,
                 plugin_args: Sequence[str] = (), scheduler_args: Sequence[str] = (),
                 device_config: str | None = None, node_config: str | None = None,
                 libvgpu_build: Path | None = None, keep_workdir: bool = False) -> None:
        self._own_workdir = workdir is None
        self.keep_workdir = keep_workdir or os.environ.get("HAMI_KEEP_WORKDIR") == "1"
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="hb", dir="/tmp"))
        self.node_name = node_name
        self.inventory = dict(inventory or default_inventory())
        self.plugin_args = list(plugin_args)
        self.scheduler_args = list(scheduler_args)
        self.libvgpu_build = libvgpu_build or REPO / "native" / "libvgpu" / "build"
        self.device_config = device_config
        self.node_config = node_config
        self.hook_path = self.workdir / "hook"
        self.key_dir = self.workdir / "allocation-key"
        self.cp: ControlPlane | None = None
        self.node: RealNode | None = None
        self.scheduler: Component | None = None
        self.kube_scheduler: SchedulerHandle | None = None
        self.plugin: Component | None = None
        self.monitor: Component | None = None
        self.scheduler_port = 0
        self._scheduler_argv: list[str] = []
        self.monitor_port = 0
        self.timings: dict[str, float] = {}

    # -- hami processes ----------------------------------------------------------------

    def _hami(self) -> list[str]:
        script = Path(sys.executable).parent / "hami"  # the venv's console script
        return [str(script)] if script.exists() else [sys.executable, "-m", "hami.cli"]

    def _env(self) -> dict[str, str]:
        src = str(REPO / "src")
        return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def _start_scheduler(self, cp: ControlPlane) -> None:
        tls = self.workdir / "tls"
        tls.mkdir(parents=True, exist_ok=True)
        ca = CertificateAuthority.create("hami-bed-ca")
        (tls / "ca.crt").write_bytes(ca.cert_pem)
        cert, key = ca.issue("hami-scheduler", ip_sans=[HOST], dns_sans=["localhost"],
                             server=True).write(tls, "serving")
        self.scheduler_port = free_port()
        argv = [*self._hami(), "scheduler", f"--kubeconfig={cp.kubeconfig}",
                f"--http_bind={HOST}:{self.scheduler_port}", f"--cert-file={cert}",
                f"--key-file={key}", f"--metrics-bind-address={HOST}:{free_port()}",
                f"--allocation-key-dir={self.key_dir}", "--register-interval=2s",
                *self._device_config_args(), *self.scheduler_args]
        self._scheduler_argv = argv
        self._spawn_scheduler()
        url = f"https://{HOST}:{self.scheduler_port}"
        client = cp.client()
        try:
            from lightkube import codecs

            client.create(codecs.from_dict(webhook_configuration("hami-bed", url, ca.cert_pem)))
            self.timings["webhook"] = wait_webhook_serving(client)
        finally:
            client.close()
        self.kube_scheduler = cp.start_scheduler(scheduler_name=SCHEDULER_NAME,
                                                 extender=ExtenderConfig(url))

    def _device_config_args(self) -> list[str]:
        if self.device_config is None:
            return []
        path = self.workdir / "device-config.yaml"
        path.write_text(self.device_config)
        return [f"--device-config-file={path}"]

    def _spawn_scheduler(self) -> None:
        assert self.cp is not None
        self.scheduler = self.cp._spawn("hami-scheduler", self._scheduler_argv)  # noqa: SLF001
        ctx = ssl.create_default_context(cafile=str(self.workdir / "tls" / "ca.crt"))
        self.timings["hami-scheduler"] = self.scheduler.wait_healthy(
            lambda: _https_ok(f"https://{HOST}:{self.scheduler_port}/readyz", ctx), "/readyz", 60)

    def restart_scheduler(self) -> Component:
        """SIGKILL ``hami scheduler`` (no clean shutdown, as a node loss or OOM kill) and
        start it again with the same arguments, port and certificate; wait for ``/readyz``.
        The webhook and the kube-scheduler's extender keep pointing at it."""
        assert self.scheduler is not None
        kill(self.scheduler)
        self._spawn_scheduler()
        return self.scheduler

    def install_lib(self) -> None:
        """``hami device-plugin --install-lib``: libvgpu.so and ld.so.preload into the
        hook path, as the chart's init step does."""
        subprocess.run([*self._hami(), "device-plugin", "--install-lib",
                        str(self.hook_path / "vgpu"),
                        f"--lib-path={self.libvgpu_build / 'libvgpu.so'}"],
                       check=True, env=self._env(), capture_output=True)

    def kubelet_watches(self) -> int:
        """How often a kubelet began watching the device plugin (ListAndWatch's first
        response, :data:`WATCHING_LINE` in its log, all runs); 0 before the first start."""
        assert self.node is not None
        log_path = self.node.log_dir / "device-plugin.log"
        try:
            return log_path.read_text(errors="replace").count(WATCHING_LINE)
        except FileNotFoundError:
            return 0

    def start_plugin(self, extra: Sequence[str] = ()) -> Component:
        """Start (or restart) ``hami device-plugin`` in the node's namespace and wait until
        the kubelet watches this run (:meth:`kubelet_watches`) and advertises its replicas
        on the Node. The Node's allocatable alone does not tell: after a restart it still
        has the previous run's, and the kubelet refuses GPU pods ("no healthy devices")
        until the new run's ListAndWatch has answered."""
        assert self.node is not None and self.cp is not None
        watches = self.kubelet_watches()
        inv = self.workdir / "inventory.yaml"
        inv.write_text(yaml.safe_dump(self.inventory))
        if self.node_config is not None:
            (self.workdir / "node-config.json").write_text(self.node_config)
        self.plugin = self.node.spawn("device-plugin", [
            *self._hami(), "device-plugin", f"--node-name={self.node_name}",
            f"--hook-path={self.hook_path}", "--backend=fake", f"--fake-inventory={inv}",
            f"--kubeconfig={self.cp.kubeconfig}", "--register-interval=1",
            f"--allocation-key-dir={self.key_dir}",
            f"--node-config-file={self.workdir / 'node-config.json'}",
            *self._device_config_args(), *self.plugin_args, *extra], env=self._env())
        client = self.cp.client()
        try:
            self.timings["device-plugin"] = self.plugin.wait_healthy(
                lambda: (self.kubelet_watches() > watches
                         and _gpu_allocatable(client, self.node_name) > 0),
                "watched by the kubelet and nvidia.com/gpu on the Node", 60)
        finally:
            client.close()
        return self.plugin

    def start_monitor(self) -> Component:
        """Start ``hami monitor`` in the node's namespace (HOOK_PATH, NODE_NAME set) and
        wait until ``/metrics`` answers."""
        assert self.node is not None and self.cp is not None
        self.monitor_port = free_port()
        # HAMi's monitor reads HOOK_PATH as the directory holding containers/ (the
        # chart sets <gpuHookPath>/vgpu), the device plugin's --hook-path is its parent
        # HAMI_RESYNC_INTERVAL: how long the directory of a deleted pod is kept (5 min
        # by default, as HAMi); short here so tests see the clean-up
        env = {**self._env(), "HOOK_PATH": str(self.hook_path / "vgpu"),
               "NODE_NAME": self.node_name, "HAMI_RESYNC_INTERVAL": "5s"}
        self.monitor = self.node.spawn("monitor", [
            *self._hami(), "monitor", f"--metrics-bind-address={HOST}:{self.monitor_port}",
            f"--kubeconfig={self.cp.kubeconfig}"], env=env)
        self.monitor.wait_healthy(lambda: bool(self.monitor_metrics()), "/metrics", 60)
        return self.monitor

    def monitor_metrics(self) -> str:
        """The monitor's ``/metrics`` text, or "" when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.monitor_port}/metrics",
                                        timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            return ""

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> GpuBed:
        """Start everything (see the module docstring); stop it all again on failure."""
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.key_dir.mkdir(exist_ok=True)
        (self.key_dir / "current").write_text(secrets.token_hex(32))
        self.cp = ControlPlane(workdir=self.workdir / "k8s")
        try:
            self.cp.start()
            client = self.cp.client()
            try:
                ensure_root_ca(client, "default", self.cp.ca_file)
            finally:
                client.close()
            self._start_scheduler(self.cp)
            imgs = [images.build_pause(self.workdir / "images", _k8s_version()),
                    images.build_gpu_test_image(self.workdir / "images", self.libvgpu_build)]
            self.node = RealNode(self.cp, self.node_name, self.workdir / "node", images=imgs)
            self.node.start()
            self.install_lib()
            self.start_plugin()
            self.start_monitor()
        except BaseException:
            self.keep_workdir = True  # its logs say why
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        return self

    def client(self, namespace: str = "default") -> Any:
        """A cluster-admin ``lightkube.Client``."""
        assert self.cp is not None, "start() first"
        return self.cp.client(namespace)

    def prepare_namespace(self, name: str) -> None:
        """Namespace + default ServiceAccount + kube-root-ca.crt (no controller manager)."""
        assert self.cp is not None
        client = self.cp.client()
        try:
            ensure_namespace(client, name)
            ensure_root_ca(client, name, self.cp.ca_file)
        finally:
            client.close()

    def check_alive(self) -> None:
        """Raise if any process of the bed exited unasked (message has its log tail)."""
        assert self.cp is not None and self.node is not None
        self.cp.check_alive()
        self.node.check_alive()

    def stop(self) -> None:
        """Stop the node (its containers first), then the control plane; then remove the
        work directory this bed created (60-80 MB), unless ``keep_workdir`` or
        ``HAMI_KEEP_WORKDIR=1`` asked to keep it."""
        try:
            if self.node is not None:
                self.node.stop()
        finally:
            if self.cp is not None:
                self.cp.stop()
            remove_own_workdir(self.workdir, self._own_workdir and not self.keep_workdir)

    def __enter__(self) -> GpuBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def remove_own_workdir(workdir: Path, remove: bool) -> None:
    """Remove ``workdir`` when ``remove`` (a bed's own temp dir at stop); a test node's
    tree holds root-owned container files, all removable by the root that ran it."""
    import shutil

    if remove:
        shutil.rmtree(workdir, ignore_errors=True)


def kill(component: Component) -> None:
    """SIGKILL ``component`` and reap it; marks it stopped so :meth:`GpuBed.check_alive`
    does not report it."""
    component.stopped = True
    if component.process.poll() is None:
        component.process.kill()
    component.process.wait()


def _k8s_version() -> str:
    from hami.testing.controlplane import KUBERNETES_VERSION

    return KUBERNETES_VERSION


def _https_ok(url: str, ctx: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _gpu_allocatable(client: Any, node: str) -> int:
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Node

    try:
        n = client.get(Node, node)
    except ApiError:
        return 0
    return int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) if n.status else 0


if __name__ == "__main__":
    # ``python -m hami.testing.gpubed up``: the command lives in gpubed_cli, which imports
    # this module (as hami.testing.gpubed, not as __main__).
    from hami.testing.gpubed_cli import main

    sys.exit(main())
