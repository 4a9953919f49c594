"""Run ``hami scheduler`` as a real process next to the real control plane.

* :class:`HamiProcess`: the scheduler as a child process (HTTPS with a certificate from a
  throw-away CA, metrics on their own port); SIGKILL and restart on the same port.
* :class:`FakeAllocator`: what the device plugin's ``Allocate`` does to the API once a pod
  is bound (no kubelet runs here): ``bind-phase=success`` and release of the node lock.
* :class:`ReadyForwarder`: a TCP forwarder that, like a Service with a readiness probe,
  sends each new connection to the replica whose ``/readyz`` answers 200 (the leader).
* helpers to make GPU nodes and pods.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hami.core.codec import encode_node_devices
from hami.core.model import DeviceInfo
from hami.testing.controlplane import (
    HOST,
    ControlPlane,
    create_gpu_node,
    die_with_parent,
    free_port,
    wait_until,
)
from hami.testing.gpupods import webhook_configuration  # noqa: F401 - re-exported
from hami.testing.pki import CertificateAuthority

SRC = Path(__file__).resolve().parents[2] / "src"


def register_annotation(node: str, gpus: int = 4, memory_mib: int = 24576, split: int = 10,
                        cores: int = 100, gpu_type: str = "NVIDIA-A10") -> str:
    """``hami.io/node-nvidia-register`` for ``gpus`` healthy GPUs of one node."""
    return encode_node_devices(
        DeviceInfo(uuid=f"GPU-{node}-{i}", index=i, split_count=split, memory_mib=memory_mib,
                   cores_percent=cores, type=gpu_type, mode="hami-core", health=True)
        for i in range(gpus))


def make_gpu_node(client: Any, name: str, *, gpus: int = 4, memory_mib: int = 24576,
                  split: int = 10, labels: dict[str, str] | None = None,
                  annotations: dict[str, str] | None = None) -> None:
    """A Ready node with HAMi's register annotation (device plugin's view). The
    scheduler writes its handshake on the node as soon as it sees it; create_gpu_node
    retries its taint patch on that conflict."""
    ann = {"hami.io/node-nvidia-register": register_annotation(name, gpus, memory_mib, split),
           "hami.io/node-handshake": "Requesting_" + time.strftime("%Y-%m-%d %H:%M:%S")}
    ann.update(annotations or {})
    create_gpu_node(client, name, gpus=gpus * split, annotations=ann, labels=labels)


def gpu_pod(name: str, *, gpus: int = 1, memory_mib: int | None = None, cores: int | None = None,
            namespace: str = "default", scheduler_name: str | None = None,
            node_selector: dict[str, str] | None = None, privileged: bool = False,
            annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pause pod asking for GPUs (as a JSON-shaped dict)."""
    limits: dict[str, str] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if memory_mib is not None:
        limits["nvidia.com/gpumem"] = str(memory_mib)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    container: dict[str, Any] = {"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"limits": limits, "requests": {"cpu": "1m"}}}
    if privileged:
        container["securityContext"] = {"privileged": True}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": dict(annotations or {})},
            "spec": spec}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


class Tls:
    """A CA and a serving certificate for 127.0.0.1 written under ``directory``."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = CertificateAuthority.create("hami-scheduler-ca")
        self.ca_pem = self.ca.cert_pem
        self.cert_file, self.key_file = self.ca.issue(
            "hami-scheduler", ip_sans=[HOST], dns_sans=["localhost"], server=True
        ).write(directory, "hami-serving")


def _insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class HamiProcess:
    """``python -m hami.scheduler.command`` as a child process."""

    def __init__(self, cp: ControlPlane, tls: Tls, workdir: Path, *,
                 args: Sequence[str] = (), port: int | None = None, name: str = "hami",
                 kubeconfig: Path | None = None) -> None:
        self.cp, self.tls, self.workdir = cp, tls, workdir
        self.kubeconfig = kubeconfig or cp.kubeconfig
        self.args = list(args)
        self.port = port or free_port()
        self.metrics_port = free_port()
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://{HOST}:{self.port}"

    def start(self, *, wait_ready: bool = True, timeout_s: float = 60.0) -> HamiProcess:
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        argv = [sys.executable, "-m", "hami.scheduler.command",
                f"--kubeconfig={self.kubeconfig}", f"--http_bind={HOST}:{self.port}",
                f"--cert-file={self.tls.cert_file}", f"--key-file={self.tls.key_file}",
                f"--metrics-bind-address={HOST}:{self.metrics_port}",
                "--register-interval=2s", *self.args]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True,
                                            preexec_fn=die_with_parent)
        if wait_ready:
            self.wait_ready(timeout_s)
        return self

    def alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited; log:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def get(self, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
        base = self.url if path != "/metrics" else f"http://{HOST}:{self.metrics_port}"
        try:
            with urllib.request.urlopen(base + path, timeout=timeout_s,
                                        context=_insecure() if base.startswith("https") else None) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except OSError:
            return 0, b""

    def post(self, path: str, body: bytes, timeout_s: float = 30.0) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=_insecure()) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def ready(self) -> bool:
        return self.get("/readyz", 2.0)[0] == 200

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        wait_until(self.ready, timeout_s=timeout_s, what=f"{self.name} /readyz", alive=self.alive)

    def status(self) -> dict[str, Any]:
        code, body = self.get("/status")
        return json.loads(body) if code == 200 else {}

    def metrics(self) -> str:
        return self.get("/metrics")[1].decode()

    def kill(self) -> None:
        """SIGKILL (no clean-up at all)."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


#: Pods with this label are left alone by :class:`FakeAllocator` (their Allocate is "late";
#: the test finishes them itself).
LATE_ALLOCATE = "e2e.hami.io/late-allocate"


class FakeAllocator:
    """The API side of the device plugin's Allocate for bound pods (spec §11): set
    ``hami.io/bind-phase=success`` and release the node lock this pod holds. Pods
    labelled :data:`LATE_ALLOCATE` are skipped. With ``lock_free`` it plays allocate
    mode ``cdi``'s PreStartContainer instead: nothing for a pod whose Binding said
    ``bind-phase=success`` and brought the ``hami.io/vgpu-node`` label (the label alone
    when it did not); for a pod still ``allocating``, one patch (``bind-phase=success``,
    the to-allocate string emptied, the label when missing); no node read, no lock."""

    def __init__(self, cp: ControlPlane, lock_free: bool = False) -> None:
        self.cp = cp
        self.lock_free = lock_free
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fake-allocator")
        self.allocated = 0
        self._seen: set[tuple[str, str, str | None]] = set()

    def start(self) -> FakeAllocator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        # ThreadPoolExecutor comes from the module's imports, in the main thread: imported
        # here, concurrent.futures.thread would register its fork hooks while the main
        # thread may be forking a child (subprocess with preexec_fn), whose parent-side
        # hook then releases a lock it never took ("release unlocked lock").
        from lightkube import Client
        from lightkube.resources.core_v1 import Pod

        client: Client = self.cp.client()
        # Several Allocate calls run at once on different nodes, as kubelets do.
        with ThreadPoolExecutor(4) as pool:
            while not self._stop.is_set():
                try:
                    for _, pod in client.watch(Pod, namespace="*", server_timeout=5):
                        if self._stop.is_set():
                            return
                        if self._wanted(pod):
                            pool.submit(self._handle, client, pod)
                except Exception:
                    time.sleep(0.2)

    def _needs(self, pod: Any) -> bool:
        """The pod is bound and its plugin would write to it (see the class)."""
        ann = pod.metadata.annotations or {}
        if not pod.spec.nodeName:
            return False
        if ann.get("hami.io/bind-phase") == "allocating":
            return True
        return (self.lock_free and ann.get("hami.io/bind-phase") == "success"
                and (pod.metadata.labels or {}).get("hami.io/vgpu-node") != pod.spec.nodeName)

    def _wanted(self, pod: Any) -> bool:
        ann = pod.metadata.annotations or {}
        key = (pod.metadata.namespace, pod.metadata.name, ann.get("hami.io/bind-time"))
        if not self._needs(pod):
            return False
        if LATE_ALLOCATE in (pod.metadata.labels or {}):
            return False
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def _handle(self, client: Any, pod: Any) -> None:
        """Serve one pod; when a request fails (the apiserver is slow or a node patch
        keeps conflicting), forget the pod so that the watch's next replay of it (every
        few seconds) serves it again: a kubelet retries Allocate the same way, and a pod
        left allocating keeps its node locked until the lock expires."""
        ann = pod.metadata.annotations or {}
        key = (pod.metadata.namespace, pod.metadata.name, ann.get("hami.io/bind-time"))
        if not self._serve(client, pod):
            self._seen.discard(key)

    def _serve(self, client: Any, pod: Any) -> bool:
        """True when the pod is served (or needs nothing), False to try again later."""
        from lightkube.resources.core_v1 import Node, Pod
        from lightkube.types import PatchType

        ann = pod.metadata.annotations or {}
        if not self._needs(pod):
            return True
        ns, name, node = pod.metadata.namespace, pod.metadata.name, pod.spec.nodeName
        if self.lock_free:
            from hami.core.codec import served_pod_devices

            try:
                meta: dict[str, Any] = {"annotations": {} if ann.get(
                    "hami.io/bind-phase") == "success" else {
                    "hami.io/bind-phase": "success",
                    "hami.io/vgpu-devices-to-allocate": served_pod_devices(
                        ann.get("hami.io/vgpu-devices-allocated", ""))}}
                if (pod.metadata.labels or {}).get("hami.io/vgpu-node") != node:
                    meta["labels"] = {"hami.io/vgpu-node": node}
                client.patch(Pod, name, {"metadata": meta}, namespace=ns,
                             patch_type=PatchType.MERGE)
                self.allocated += 1
            except Exception:
                return False
            return True
        try:
            client.patch(Pod, name, {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}},
                         namespace=ns, patch_type=PatchType.MERGE)
            # The pod now says success, so the watch will not offer it again: keep at
            # the release (conflicts, a slow apiserver) until the lock is gone.
            released = False
            for _ in range(100):
                try:
                    obj = client.get(Node, node)
                    lock = (obj.metadata.annotations or {}).get("hami.io/mutex.lock", "")
                    if lock.endswith(f",{ns},{name}"):
                        client.patch(Node, node, {"metadata": {
                            "annotations": {"hami.io/mutex.lock": None},
                            "resourceVersion": obj.metadata.resourceVersion}},
                            patch_type=PatchType.MERGE)
                    released = True
                    break
                except Exception:
                    time.sleep(0.1)
            if not released:
                return False
            self.allocated += 1
            return True
        except Exception:
            return False


class ReadyForwarder:
    """127.0.0.1:<port> -> the backend whose ``/readyz`` is 200 (checked per connection)."""

    def __init__(self, backends: Iterable[HamiProcess]) -> None:
        self.backends = list(backends)
        self.port = free_port()
        self._sock = socket.create_server((HOST, self.port))
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://{HOST}:{self.port}"

    def _pick(self) -> HamiProcess | None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for backend in self.backends:
                if backend.process and backend.process.poll() is None and backend.ready():
                    return backend
            time.sleep(0.2)
        return None

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        backend = self._pick()
        if backend is None:
            conn.close()
            return
        try:
            upstream = socket.create_connection((HOST, backend.port))
        except OSError:
            conn.close()
            return

        def pipe(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()
        pipe(conn, upstream)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()




class RoundRobinForwarder(ReadyForwarder):
    """127.0.0.1:<port> -> each live backend in turn, one TCP connection each (a Service
    in front of several replicas, whether or not they lead); ``served`` counts the
    connections each backend got."""

    def __init__(self, backends: Iterable[HamiProcess]) -> None:
        self._turn = 0
        self._lock = threading.Lock()
        self.served: dict[str, int] = {}
        super().__init__(backends)

    def _pick(self) -> HamiProcess | None:
        live = [b for b in self.backends if b.process and b.process.poll() is None]
        if not live:
            return None
        with self._lock:
            backend = live[self._turn % len(live)]
            self._turn += 1
            self.served[backend.name] = self.served.get(backend.name, 0) + 1
        return backend


def reconcile_templates(cp: ControlPlane, pod: Any) -> dict[str, str]:
    """What ``hami scheduler --dra-mode`` does once its pod watch brings ``pod`` (created
    from an in-process DRA webhook's answer, signed with this process's key): create the
    hami ResourceClaimTemplates it names (:class:`hami.dra.templates.TemplateReconciler`
    on the real API). ``pod``: a dict or lightkube object as the API returned it."""
    import asyncio

    from hami.dra.signedspecs import process_keys
    from hami.dra.templates import TemplateReconciler

    doc = pod if isinstance(pod, dict) else pod.to_dict()

    async def run() -> dict[str, str]:
        client = cp.async_client()
        try:
            return await TemplateReconciler(client, process_keys()).reconcile(doc)
        finally:
            await client.close()

    return asyncio.run(run())
