"""The device plugin process: device state, kubelet registration, node annotation and
health loops (HAMi-core 1.2), and the host files Allocate writes. The gRPC servicer is
:mod:`.servicer`; decisions live in :mod:`.allocate`, :mod:`.register` and
:mod:`.health`; this module only moves data.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from hami.api import names
from hami.core.model import DeviceInfo, MigProfile
from hami.deviceplugin import feedbackfile
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import GpuBackend, PhysicalGpu
from hami.deviceplugin.health import HealthPolicy, gpus_to_mark
from hami.deviceplugin.kube import KubeApi, KubeError
from hami.deviceplugin.register import (
    annotations_to_write,
    encode_register,
    kubelet_devices,
    node_devices,
    replica_map,
)
from hami.deviceplugin.v1beta1 import api_pb2 as pb
from hami.deviceplugin.v1beta1 import api_pb2_grpc as pbg

if TYPE_CHECKING:
    from hami.deviceplugin.servicer import DevicePluginServicer

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
NODE_REGISTER = "hami.io/node-nvidia-register"


def socket_name(resource_name: str) -> str:
    """``nvidia-<part after '/'>.sock`` (``nvidia.com/gpu`` -> ``nvidia-gpu.sock``)."""
    return f"nvidia-{resource_name.split('/')[-1]}.sock"


class DeviceState:
    """GPUs, health marks and a version counter that wakes ListAndWatch streams."""

    def __init__(self, gpus: list[PhysicalGpu], cfg: PluginConfig,
                 mig: dict[str, tuple[int, tuple[MigProfile, ...]]] | None = None) -> None:
        self.cfg = cfg
        self.gpus = gpus
        self.mig = mig or {}
        self.unhealthy: set[str] = set()
        self.version = 0
        self.cond = threading.Condition()
        self._refresh()

    def _refresh(self) -> None:
        self.devices: tuple[DeviceInfo, ...] = node_devices(
            self.gpus, self.cfg, frozenset(self.unhealthy), self.mig)
        self.replicas = replica_map(self.devices)

    def mark_unhealthy(self, uuids: frozenset[str]) -> bool:
        """Mark GPUs down (no recovery, HAMi-core 1.2); True when something changed."""
        with self.cond:
            new = set(uuids) - self.unhealthy
            if not new:
                return False
            self.unhealthy |= new
            self._refresh()
            self.version += 1
            self.cond.notify_all()
            return True

    def list_response(self) -> pb.ListAndWatchResponse:
        devs = []
        for rid, health, numa in kubelet_devices(self.devices, self.cfg.enable_numa_topology):
            d = pb.Device(ID=rid, health=health)
            if numa is not None:
                d.topology.nodes.add(ID=numa)
            devs.append(d)
        return pb.ListAndWatchResponse(devices=devs)


def make_host_dirs(dirs: tuple[str, ...]) -> None:
    """``rm -rf`` + ``mkdir 0777`` each directory: the container's cache dir and its own
    lock dir (parents, such as the plugin-only ``<ctr>.plugin`` dir, get the default
    mode). Raises ``OSError``."""
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d, exist_ok=True)
        os.chmod(d, 0o777)


def write_host_files(files: tuple[tuple[str, str], ...]) -> None:
    """Write each ``(path, text)`` as a mode-0444 file, atomically (temporary file, then
    rename), creating the parent directory. Raises ``OSError``."""
    for path, text in files:
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
        try:
            os.write(fd, text.encode())
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)
        os.replace(tmp, path)


def write_feedback_files(paths: tuple[str, ...]) -> None:
    """Create each monitor feedback file with its initial values, or reset one that is
    there in place (:func:`hami.deviceplugin.feedbackfile.create`). Raises ``OSError``."""
    for path in paths:
        feedbackfile.create(path)


def write_json_file(path: Path, doc: object) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (temporary file in the same directory,
    then rename), mode 0644: a reader (the container runtime reading a CDI spec) never
    sees half a file. Raises ``OSError``."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


# --- lifecycle -----------------------------------------------------------------------------


class PluginServer:
    """Serves the plugin on ``<plugin_dir>/<socket>`` and keeps it registered.

    Re-registers when ``kubelet.sock`` is recreated (new inode/ctime) or our own socket
    vanishes (the kubelet wipes the directory when it restarts); restarts the gRPC server
    in the latter case. Gives up (raises) after more than 5 restarts within an hour.
    """

    def __init__(self, servicer: DevicePluginServicer, plugin_dir: Path, kubelet_socket: Path,
                 resource_name: str, poll_s: float = 0.5) -> None:
        self.servicer = servicer
        self.plugin_dir = plugin_dir
        self.kubelet_socket = kubelet_socket
        self.resource_name = resource_name
        self.endpoint = socket_name(resource_name)
        self.socket = plugin_dir / self.endpoint
        self.poll_s = poll_s
        self.server: grpc.Server | None = None
        self.registered_stamp: tuple[int, int] | None = None
        self.registrations = 0
        self.restarts: list[float] = []
        self.restart_requested = False

    def start(self) -> None:
        """Start (or restart) the gRPC server and wait until it answers (5 s)."""
        if self.server is not None:
            self.server.stop(grace=0.5).wait()
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        if self.socket.exists():
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pbg.add_DevicePluginServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        with grpc.insecure_channel(f"unix://{self.socket}") as ch:
            grpc.channel_ready_future(ch).result(timeout=5)
        self.server = server
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < 3600] + [now]
        if len(self.restarts) > 6:
            raise RuntimeError("device plugin server restarted more than 5 times in an hour")
        log.info("serving %s on %s", self.resource_name, self.socket)

    def _kubelet_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.kubelet_socket.stat()
        except OSError:
            return None
        return st.st_ino, st.st_ctime_ns

    def register(self) -> None:
        """One Register call to the kubelet (5 s timeout). Raises ``grpc.RpcError``."""
        stamp = self._kubelet_stamp()
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as ch:
            stub = pbg.RegistrationStub(ch)  # type: ignore[no-untyped-call]
            # The kubelet keeps the options of this request (it never asks
            # GetDevicePluginOptions), so they must say whether PreStartContainer is wanted.
            stub.Register(pb.RegisterRequest(
                version=API_VERSION, endpoint=self.endpoint, resource_name=self.resource_name,
                options=self.servicer.options()), timeout=5)
        self.registered_stamp = stamp
        self.registrations += 1
        log.info("registered %s with kubelet %s", self.resource_name, self.kubelet_socket)

    def tick(self) -> None:
        """One watch step: restart when our socket is gone, register when needed."""
        if self.server is None or self.restart_requested or not self.socket.exists():
            self.restart_requested = False
            self.start()
            self.registered_stamp = None
        stamp = self._kubelet_stamp()
        if stamp is not None and stamp != self.registered_stamp:
            try:
                self.register()
            except grpc.RpcError as exc:
                log.warning("register with kubelet failed (will retry): %s", exc)

    def run(self, stop: threading.Event) -> None:
        """Watch loop until ``stop``."""
        while not stop.is_set():
            self.tick()
            stop.wait(self.poll_s)
        if self.server is not None:
            self.server.stop(grace=1).wait()


class NodeRegistrar:
    """Keeps ``hami.io/node-nvidia-register`` on the Node (HAMi-core 1.2: a pass every
    ``interval_s`` seconds, ``retry_s`` after an error; :meth:`kick` forces an early pass).

    Ours: each pass compares the value with the Node's annotations (the node watch's copy,
    a GET while the watch reconnects), not with the value sent last, so a Node deleted and
    re-created, or an annotation removed or altered by someone else, is re-written on the
    next pass; a pass where the Node carries the value writes nothing. While the Node is
    missing (404) that is logged once and the pass is retried."""

    def __init__(self, state: DeviceState, kube: KubeApi, node: str,
                 interval_s: float = 30.0, retry_s: float = 5.0,
                 paused: Callable[[], bool] = lambda: False,
                 allocate_mode: str = names.ALLOCATE_MODE_NODE_LOCK,
                 trust_unsigned: bool | None = None) -> None:
        self.paused = paused
        self.allocate_mode = allocate_mode
        self.trust_unsigned = trust_unsigned
        self.state = state
        self.kube = kube
        self.node = node
        self.interval_s = interval_s
        self.retry_s = retry_s
        self.patches = 0
        self.node_missing = False
        self._kick = threading.Event()

    def kick(self) -> None:
        self._kick.set()

    def wanted(self) -> dict[str, str | None]:
        """Annotation key -> value this plugin keeps on its Node (None: must be absent).

        Ours: in allocate mode ``cdi`` the Node also says so
        (``hami.io/node-allocate-mode: cdi``), so that hami's scheduler binds its pods
        without the node lock; in HAMi's mode the annotation is removed, so a node that
        went back to the lock is locked again. The Node also says the plugin's signing
        mode (``hami.io/node-trust-unsigned-allocations``: ``"true"`` when it serves
        unsigned allocations, ``"false"`` in strict signing), which ``hami top`` shows;
        a registrar not told the mode (``trust_unsigned`` None) removes it."""
        mode = (names.ALLOCATE_MODE_CDI if self.allocate_mode == names.ALLOCATE_MODE_CDI
                else None)
        trust = None if self.trust_unsigned is None else str(self.trust_unsigned).lower()
        return {NODE_REGISTER: encode_register(self.state.devices),
                names.NODE_ALLOCATE_MODE: mode, names.NODE_TRUST_UNSIGNED: trust}

    def once(self) -> bool:
        """Read the Node, patch what differs. Returns True on success (or nothing to do);
        False (retry soon) after an API error, while the Node is missing, or while
        ``paused`` (the MIG apply lock exists, HAMi-core 1.2)."""
        if self.paused():
            return False
        wanted = self.wanted()
        try:
            current, _rv = self.kube.node_annotations(self.node)
            patch = annotations_to_write(wanted, current)
            if patch:
                after = self.kube.patch_node_annotations(self.node, patch)
                if after is not None and self.kube.node_watch is not None:
                    self.kube.node_watch.offer(*after)  # the next pass must not re-send it
                self.patches += 1
        except KubeError as exc:
            if exc.code != 404:
                log.warning("node register failed (will retry): %s", exc)
            elif not self.node_missing:
                self.node_missing = True
                log.warning("node %s not found (deleted?): registering again once it is "
                            "back: %s", self.node, exc)
            return False
        if self.node_missing:
            self.node_missing = False
            log.info("node %s is back: registered again", self.node)
        return True

    def run(self, stop: threading.Event) -> None:
        """Passes until ``stop``; after a failed pass the next comes after ``retry_s``,
        never later than ``interval_s``."""
        while not stop.is_set():
            try:
                ok = self.once()
            except Exception:  # noqa: BLE001 - never let the loop die; retry soon
                log.exception("node register pass failed")
                ok = False
            self._kick.clear()
            wait = self.interval_s if ok else min(self.retry_s, self.interval_s)
            deadline = time.monotonic() + wait
            while not stop.is_set() and not self._kick.is_set() and time.monotonic() < deadline:
                stop.wait(min(0.2, wait))


def health_loop(backend: GpuBackend, state: DeviceState, policy: HealthPolicy,
                on_change: Callable[[], None], stop: threading.Event,
                paused: Callable[[], bool] = lambda: False) -> None:
    """Wait for NVML (or fake) events; mark GPUs unhealthy per :mod:`.health` rules.
    Events that arrive while ``paused`` (MIG apply lock, HAMi-core 1.2) are dropped."""
    if policy.disabled:
        log.info("health checks disabled")
        stop.wait()
        return
    known = [g.uuid for g in state.gpus]
    initial = frozenset(g.uuid for g in state.gpus if not g.healthy)
    if initial and state.mark_unhealthy(initial):
        on_change()
    while not stop.is_set():
        ev = backend.wait_event(5.0)
        if ev is None:
            continue
        if paused():
            log.info("health event xid=%d uuid=%s ignored: MIG reconfiguration", ev.xid, ev.uuid)
            continue
        marks = gpus_to_mark(policy, ev.event_type, ev.xid, ev.uuid, known)
        if marks:
            log.warning("health event xid=%d uuid=%s: marking %s unhealthy", ev.xid, ev.uuid,
                        sorted(marks))
        if marks and state.mark_unhealthy(marks):
            on_change()
