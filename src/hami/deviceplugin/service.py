"""The device plugin process: gRPC servicer, kubelet registration, node annotation and
health loops (HAMi-core 1.2). Decisions live in :mod:`.allocate`,
:mod:`.register` and :mod:`.health`; this module only moves data.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from hami.core.model import DeviceInfo, MigProfile
from hami.deviceplugin import allocate as al
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import GpuBackend, PhysicalGpu
from hami.deviceplugin.guard import AllocationGuard
from hami.deviceplugin.health import HealthPolicy, gpus_to_mark
from hami.deviceplugin.kube import KubeApi, KubeError
from hami.deviceplugin.mig import MigManager
from hami.deviceplugin.register import (
    annotations_to_write,
    encode_register,
    kubelet_devices,
    node_devices,
    replica_map,
)
from hami.deviceplugin.v1beta1 import api_pb2 as pb
from hami.deviceplugin.v1beta1 import api_pb2_grpc as pbg

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


@dataclass
class AllocateStats:
    """Counters for tests and logs."""

    served: int = 0
    failed: int = 0


class DevicePluginServicer(pbg.DevicePluginServicer):
    """The five RPCs of the kubelet device plugin API v1beta1."""

    def __init__(self, state: DeviceState, kube: KubeApi, node: str,
                 settings: al.NodeSettings, stop: threading.Event) -> None:
        self.state = state
        self.kube = kube
        self.node = node
        self.settings = settings
        self.stop = stop
        self.mutex = threading.Lock()
        self.stats = AllocateStats()
        #: Set in ``operatingmode: mig`` (:class:`hami.deviceplugin.mig.MigManager`).
        self.mig: MigManager | None = None
        #: Refuses allocations hami's scheduler did not sign; None serves them all (HAMi).
        self.guard: AllocationGuard | None = None
        self.new_cache_name: Callable[[], str] = lambda: str(uuidlib.uuid4())
        # Node-lock releases run after the response is sent; the next Allocate waits for
        # the previous release first, so the lock is always settled when a pod is chosen.
        self._releaser = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="release")
        self._release: futures.Future[bool] | None = None

    def settle(self, timeout_s: float = 15.0) -> None:
        """Wait for the last background node-lock release (tests, next Allocate)."""
        pending, self._release = self._release, None
        if pending is not None:
            try:
                pending.result(timeout=timeout_s)
            except Exception as exc:  # noqa: BLE001 - logged; the scheduler's lock expiry covers it
                log.error("node lock release failed: %s", exc)

    # -- options / list ---------------------------------------------------------------
    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False,
                                      get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        seen = -1
        while not self.stop.is_set() and (context is None or context.is_active()):
            with self.state.cond:
                if seen == self.state.version:
                    self.state.cond.wait(timeout=1.0)
                    continue
                seen = self.state.version
                resp = self.state.list_response()
            yield resp

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: Any) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    # -- pod lookup ------------------------------------------------------------------------
    def _lookup(self) -> tuple[al.PodView | None, list[al.PodView], tuple[dict[str, str], str]]:
        """``(lock owner, the node's other Pending pods, node snapshot)`` for one call.

        The node and its Pending pods come from the watches when they are live (else a
        GET and a LIST); the lock owner is read live. Every Pending pod is needed: a pod
        is served only when no other pod of the node could be the one kubelet is
        admitting (:func:`.allocate.choose_pod`). Raises :class:`KubeError`.
        """
        node_meta = self.kube.node_annotations(self.node)
        key = al.lock_owner(node_meta[0].get(al.NODE_LOCK))
        owner = self.kube.get_pod(*key) if key else None
        pods = [p for p in self.kube.pending_pods(self.node) if (p.namespace, p.name) != key]
        return owner, pods, node_meta

    def _choose(self, reqs: list[list[str]], replicas: Mapping[str, str]
                ) -> tuple[al.PodView, tuple[dict[str, str], str]]:
        """The pod this Allocate serves, read live, and the node snapshot.

        Raises :class:`.allocate.AllocateError` (no pod, several pods could be meant, or
        the pods changed under us; no pod is then marked failed).
        """
        try:
            owner, others, node_meta = self._lookup()
            self._refuse_unsigned_waiters(others)
            pod = al.choose_pod(reqs, owner, others, self.node, replicas)
            if pod is None:
                raise al.AllocateError(
                    f"no pending pod with devices to allocate on node {self.node}")
            if pod is owner:
                return pod, node_meta
            # A watched copy: decide again on the live pod before serving it.
            live = self.kube.get_pod(pod.namespace, pod.name)
        except KubeError as exc:
            raise al.AllocateError(f"pod lookup failed: {exc}") from None
        key = (pod.namespace, pod.name)
        others = [p for p in others if (p.namespace, p.name) != key]
        again = al.choose_pod(reqs, owner, [*others, *([live] if live else [])],
                              self.node, replicas)
        if live is None or again is None or (again.namespace, again.name) != key:
            raise al.AllocateError(f"{pod.namespace}/{pod.name} changed during Allocate")
        return again, node_meta

    def _refuse_unsigned_waiters(self, pending: list[al.PodView]) -> None:
        """With the guard on: kubelet's request names no pod, so when a Pending pod of
        this node asks for the plugin's resource without hami's signed allocation (a pod
        of another scheduler, or one created with ``spec.nodeName``), this Allocate may
        be for it; serving a waiting hami pod's grant would hand that pod another pod's
        slice. Raises :class:`.allocate.AllocateError` (no pod is marked failed)."""
        if self.guard is None:
            return
        resource = self.state.cfg.resource_name
        strangers = sorted(f"{p.namespace}/{p.name}" for p in pending
                           if resource in p.resource_names
                           and not self.guard.signed_for(p, self.node))
        if strangers:
            raise al.AllocateError(
                f"pods without hami's allocation wait for {resource} on node {self.node}: "
                f"{', '.join(strangers)}; refusing rather than serving one pod another "
                "pod's devices")

    # -- GetPreferredAllocation --------------------------------------------------------
    def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                               context: Any) -> pb.PreferredAllocationResponse:
        reqs = [al.PreferredRequest(tuple(r.available_deviceIDs), tuple(r.must_include_deviceIDs),
                                    r.allocation_size) for r in request.container_requests]
        replicas = self.state.replicas
        pod = None
        try:
            with self.mutex:
                self.settle()
                owner, others, _ = self._lookup()
                pod = al.choose_preferred_pod(reqs, owner, others, self.node, replicas)
        except KubeError as exc:
            log.warning("GetPreferredAllocation: pod lookup failed, answering without it: %s", exc)
        answer = al.preferred_allocation(pod, reqs, replicas)
        return pb.PreferredAllocationResponse(container_responses=[
            pb.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in answer])

    # -- Allocate ------------------------------------------------------------------------
    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        reqs = [list(r.devices_ids) for r in request.container_requests]
        if reqs and reqs[0] and "MIG" in reqs[0][0]:
            return pb.AllocateResponse(container_responses=[
                pb.ContainerAllocateResponse(envs=al.mig_passthrough(ids)) for ids in reqs])
        with self.mutex:
            try:
                return self._allocate(reqs)
            except al.AllocateError as exc:
                self.stats.failed += 1
                log.error("Allocate failed: %s", exc)
                if context is not None:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                raise

    def _allocate(self, reqs: list[list[str]]) -> pb.AllocateResponse:
        self.settle()
        if self.state.cfg.operating_mode == "mig" and self.mig is None:
            raise al.AllocateError("operatingmode mig: no MIG manager (no MIG GPU registered)")
        replicas = self.state.replicas
        pod, node_meta = self._choose(reqs, replicas)
        if self.guard is not None:
            try:
                self.guard.check(pod, self.node)
            except al.AllocateError:
                self._fail(pod, node_meta)
                raise
        if self.mig is not None:
            return self._allocate_mig(pod, reqs, node_meta)
        try:
            plan = al.plan_allocation(pod, reqs, self.state.cfg, self.settings,
                                      [self.new_cache_name() for _ in reqs])
            for c in plan.containers:
                for ids in (reqs[plan.containers.index(c)],):
                    phys = {al.physical_uuid(i, replicas) for i in ids}
                    if phys != {d.uuid for d in c.devices}:
                        log.warning("%s/%s container %s: kubelet chose replicas of %s, serving "
                                    "the scheduler's GPUs %s", pod.namespace, pod.name,
                                    c.container_name, sorted(phys),
                                    [d.uuid for d in c.devices])
                make_host_dirs(c.host_dirs)
                write_host_files(c.host_files)
            # One merge patch: the emptied entries and, when nothing is left (the plan was
            # computed from the pod as read under the plugin mutex, the only writer of
            # this annotation), bind-phase success. HAMi patches, re-reads, then patches
            # again; the outcome is the same with one round trip less (HAMi-core 1.2).
            update = {al.DEVICES_TO_ALLOCATE: plan.to_allocate}
            if plan.complete:
                update[al.BIND_PHASE] = "success"
            self.kube.patch_pod_annotations(pod.namespace, pod.name, update)
            if plan.complete:
                self._release = self._releaser.submit(
                    self.kube.release_node_lock, self.node, pod.namespace, pod.name, node_meta)
        except (al.AllocateError, KubeError, OSError) as exc:
            self._fail(pod, node_meta)
            raise al.AllocateError(f"{pod.namespace}/{pod.name}: {exc}") from None
        self.stats.served += 1
        return pb.AllocateResponse(container_responses=[_response(c) for c in plan.containers])

    def _allocate_mig(self, pod: al.PodView, reqs: list[list[str]],
                      node_meta: tuple[dict[str, str], str]) -> pb.AllocateResponse:
        """MIG mode: instances, MIG UUIDs, write-back (:mod:`.mig`); then HAMi-core 1.2 as usual."""
        assert self.mig is not None
        try:
            result = self.mig.allocate(pod, reqs)
        except al.AllocateError as exc:
            self._fail(pod, node_meta)
            raise al.AllocateError(f"{pod.namespace}/{pod.name}: {exc}") from None
        if result.complete:
            self._release = self._releaser.submit(
                self.kube.release_node_lock, self.node, pod.namespace, pod.name, node_meta)
        self.stats.served += 1
        return pb.AllocateResponse(container_responses=[
            pb.ContainerAllocateResponse(envs=e) for e in result.envs])

    def _fail(self, pod: al.PodView, node_meta: tuple[dict[str, str], str]) -> None:
        try:
            self.kube.patch_pod_annotations(pod.namespace, pod.name, {al.BIND_PHASE: "failed"})
        except KubeError as exc:
            log.error("cannot mark %s/%s failed: %s", pod.namespace, pod.name, exc)
        self.kube.release_node_lock(self.node, pod.namespace, pod.name, known=node_meta)


def _response(c: al.ContainerPlan) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=c.envs,
        mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path,
                         read_only=m.read_only) for m in c.mounts])


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
            stub.Register(pb.RegisterRequest(
                version=API_VERSION, endpoint=self.endpoint, resource_name=self.resource_name,
                options=pb.DevicePluginOptions(get_preferred_allocation_available=True)),
                timeout=5)
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
                 paused: Callable[[], bool] = lambda: False) -> None:
        self.paused = paused
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

    def wanted(self) -> dict[str, str]:
        """Annotation key -> value this plugin keeps on its Node."""
        return {NODE_REGISTER: encode_register(self.state.devices)}

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
