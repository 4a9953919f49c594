"""Allocate mode ``cdi``: the shell. Allocate names a CDI device per container;
PreStartContainer finds the container through the kubelet's pod-resources API and writes
its host files and CDI spec; the pod is written to only on a refusal or when it lacks
what the Binding should have brought. Decisions are
:mod:`hami.deviceplugin.cdimode`'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from hami.deviceplugin import allocate as al
from hami.deviceplugin import cdimode as cm
from hami.deviceplugin.guard import AllocationGuard
from hami.deviceplugin.kube import KubeApi, KubeError
from hami.deviceplugin.podresources import api_pb2 as prpb
from hami.deviceplugin.podresources import api_pb2_grpc as prpbg
from hami.deviceplugin.service import (
    DeviceState,
    make_host_dirs,
    write_feedback_files,
    write_host_files,
    write_json_file,
)
from hami.deviceplugin.v1beta1 import api_pb2 as pb

log = logging.getLogger(__name__)

#: The kubelet's pod-resources socket (mounted into the plugin's pod).
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
#: Where the container runtime looks for CDI specs (containerd's and CRI-O's default).
DEFAULT_CDI_DIR = Path("/var/run/cdi")


class PodResourcesClient:
    """``List`` of the kubelet's pod-resources API v1 over its unix socket (one channel,
    reconnected by gRPC as needed; ``timeout_s`` per call)."""

    def __init__(self, socket: Path, timeout_s: float = 5.0) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._lock = threading.Lock()

    def holders(self, resource_name: str) -> list[cm.Holder]:
        """Every container of the kubelet's active pods holding devices of
        ``resource_name``. Raises :class:`hami.deviceplugin.allocate.AllocateError` when
        the kubelet does not answer."""
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(f"unix://{self.socket}")
                self._stub = prpbg.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
            stub = self._stub
        try:
            resp = stub.List(prpb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise al.AllocateError(f"kubelet pod-resources {self.socket}: {exc.code().name}: "
                                   f"{exc.details()}") from None
        out = []
        for p in resp.pod_resources:
            for c in p.containers:
                ids = frozenset(i for d in c.devices if d.resource_name == resource_name
                                for i in d.device_ids)
                if ids:
                    out.append(cm.Holder(p.namespace, p.name, c.name, ids))
        return out

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


class CdiAllocator:
    """Allocate and PreStartContainer of allocate mode ``cdi`` for one resource.

    ``spec_dir`` is the CDI spec directory the runtime reads; ``guard`` (None: trust
    unsigned allocations) is applied to the pod as in HAMi's mode. PreStartContainer
    calls are served one at a time (``mutex``), so a spec sweep never races a write.
    """

    def __init__(self, state: DeviceState, kube: KubeApi, node: str,
                 settings: al.NodeSettings, pod_resources: PodResourcesClient,
                 spec_dir: Path, guard: AllocationGuard | None,
                 new_cache_name: Callable[[], str]) -> None:
        self.state = state
        self.kube = kube
        self.node = node
        self.settings = settings
        self.pod_resources = pod_resources
        self.spec_dir = spec_dir
        self.guard = guard
        self.new_cache_name = new_cache_name
        self.mutex = threading.Lock()
        self.written = 0  #: specs written (not counting restarts of a served container)
        self.completed = 0  #: completion patches written (:func:`.cdimode.completion_patch`)
        self.failed = 0  #: pods marked ``bind-phase=failed``
        self.swept = 0  #: stale specs removed

    @property
    def resource(self) -> str:
        return self.state.cfg.resource_name

    def allocate(self, reqs: Sequence[Sequence[str]]) -> pb.AllocateResponse:
        """One CDI device per container request and the fail-closed env; no pod, no I/O."""
        return pb.AllocateResponse(container_responses=[
            pb.ContainerAllocateResponse(
                envs=dict(cm.FAIL_CLOSED_ENV),
                cdi_devices=[pb.CDIDevice(name=cm.cdi_device_name(self.resource, ids))])
            for ids in reqs])

    def prestart(self, device_ids: Sequence[str]) -> tuple[al.PodView, str]:
        """Serve the container that holds ``device_ids``: host dirs and files, CDI spec
        (kept as is when it was written for this very container: a restart or a replayed
        call), the pod's completion patch when it needs one (usually none: the Binding
        said ``success``), then a sweep of stale specs. Returns the pod and container
        served. A pod bound here whose container is refused is marked
        ``bind-phase=failed``.

        Raises :class:`hami.deviceplugin.allocate.AllocateError`: the kubelet lists no
        (or more than one) container with exactly these IDs, the pod is gone, not bound
        here, not signed by hami's scheduler (with the guard), grants the container no or
        other devices, or a file cannot be written.
        """
        with self.mutex:
            holders = self.pod_resources.holders(self.resource)
            holder = cm.holder_of(holders, device_ids)
            pod = self._pod(holder.namespace, holder.pod)
            cm.check_pod_here(pod, self.node)
            try:
                self._serve(pod, holder, device_ids)
            except al.AllocateError:
                self._fail(pod)
                raise
            self._complete(pod, holders)
            self._sweep(holders)
            return pod, holder.container

    def sweep(self) -> int:
        """Remove the specs of devices no container holds any more; returns how many
        (0 when the kubelet does not answer)."""
        with self.mutex:
            try:
                holders = self.pod_resources.holders(self.resource)
            except al.AllocateError as exc:
                log.info("CDI spec sweep skipped: %s", exc)
                return 0
            return self._sweep(holders)

    def sweep_loop(self, stop: threading.Event, interval_s: float = 60.0) -> None:
        """:meth:`sweep` every ``interval_s`` until ``stop``."""
        while not stop.wait(interval_s):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - never let the loop die
                log.exception("CDI spec sweep failed")

    # -- internals ---------------------------------------------------------------------
    def _serve(self, pod: al.PodView, holder: cm.Holder, device_ids: Sequence[str]) -> None:
        """The guard's check, then the container's host files and CDI spec (kept when it
        was written for this very container). Raises :class:`.allocate.AllocateError`."""
        if self.guard is not None:
            self.guard.check(pod, self.node)
        path = self.spec_dir / cm.spec_file_name(self.resource, holder.device_ids)
        if cm.spec_owner(_read_spec(path)) == (pod.uid, holder.container):
            return
        plan = cm.container_plan_for(pod, holder.container, sorted(device_ids),
                                     self.state.cfg, self.settings, self.new_cache_name())
        name = cm.cdi_device_name(self.resource, holder.device_ids)
        try:
            make_host_dirs(plan.host_dirs)
            write_host_files(plan.host_files)
            write_feedback_files(plan.feedback_files)
            self.spec_dir.mkdir(parents=True, exist_ok=True)
            write_json_file(path, cm.spec_for(name, plan, pod))
        except OSError as exc:
            raise al.AllocateError(f"{pod.namespace}/{pod.name}: {exc}") from None
        self.written += 1

    def _fail(self, pod: al.PodView) -> None:
        """Mark a pod bound here whose container is refused ``bind-phase=failed`` (once:
        :func:`.cdimode.failure_patch`); a failed write is logged."""
        patch = cm.failure_patch(pod)
        if patch is None:
            return
        try:
            self.kube.patch_pod_annotations(pod.namespace, pod.name, patch)
            self.failed += 1
        except KubeError as exc:
            log.error("cannot mark %s/%s failed: %s", pod.namespace, pod.name, exc)

    def _pod(self, namespace: str, name: str) -> al.PodView:
        """The pod from the pod watch (the node's Pending pods) or a GET. The kubelet's
        pod-resources API names pods without their UID, so a cached pod that is being
        deleted is not trusted: a new pod may already hold its name (and the deleted
        pod's signed grant must not be served to it); the GET says which pod that is.
        Raises :class:`~hami.deviceplugin.allocate.AllocateError` for a pod that is
        missing or being deleted."""
        watch = self.kube.pod_watch
        cached = watch.pods() if watch is not None else None
        for p in cached or ():
            if p.namespace == namespace and p.name == name and not p.deleting:
                return p
        try:
            pod = self.kube.get_pod(namespace, name)
        except KubeError as exc:
            raise al.AllocateError(f"pod {namespace}/{name}: {exc}") from None
        if pod is None:
            raise al.AllocateError(f"pod {namespace}/{name} not found")
        if pod.deleting:
            raise al.AllocateError(f"pod {namespace}/{name} is being deleted")
        return pod

    def _complete(self, pod: al.PodView, holders: Sequence[cm.Holder]) -> None:
        """Once every GPU container of the pod has its spec, the completion patch if the
        pod needs one (:func:`.cdimode.completion_patch`: none when its Binding said
        ``success`` and brought the label); a failed patch is logged (nothing waits on it
        in this mode) and retried by the pod's next PreStartContainer."""
        served = [h.container for h in holders
                  if (h.namespace, h.pod) == (pod.namespace, pod.name)
                  and cm.spec_owner(_read_spec(
                      self.spec_dir / cm.spec_file_name(self.resource, h.device_ids)))
                  == (pod.uid, h.container)]
        if not cm.all_served(pod, served):
            return
        patch = cm.completion_patch(pod)
        if patch is None:
            return
        try:
            self.kube.patch_pod_annotations(pod.namespace, pod.name, patch)
            self.completed += 1
        except KubeError as exc:
            log.warning("%s/%s served, but bind-phase not written: %s",
                        pod.namespace, pod.name, exc)

    def _sweep(self, holders: Sequence[cm.Holder]) -> int:
        live = {cm.spec_file_name(self.resource, h.device_ids) for h in holders}
        try:
            names = os.listdir(self.spec_dir)
        except FileNotFoundError:
            return 0
        stale = cm.stale_specs(self.resource, names, live)
        for f in stale:
            with contextlib.suppress(FileNotFoundError):
                (self.spec_dir / f).unlink()
            log.info("removed CDI spec %s: no container holds its devices", f)
        self.swept += len(stale)
        return len(stale)


def _read_spec(path: Path) -> Any:
    """The spec at ``path`` as parsed JSON; None when absent or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
