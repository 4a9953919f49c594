"""The kubelet's device plugin API v1beta1 (gRPC servicer): options, ListAndWatch,
GetPreferredAllocation, and Allocate in HAMi's protocol (the pod found through the node
lock and the node's waiting pods, :mod:`.allocate`); in allocate mode ``cdi`` Allocate and
PreStartContainer go to :class:`hami.deviceplugin.cdiallocate.CdiAllocator` instead.
"""

from __future__ import annotations

import logging
import threading
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

from hami.deviceplugin import allocate as al
from hami.deviceplugin.cdiallocate import CdiAllocator
from hami.deviceplugin.guard import AllocationGuard
from hami.deviceplugin.kube import KubeApi, KubeError
from hami.deviceplugin.mig import MigManager
from hami.deviceplugin.service import (
    DeviceState,
    make_host_dirs,
    write_feedback_files,
    write_host_files,
)
from hami.deviceplugin.v1beta1 import api_pb2 as pb
from hami.deviceplugin.v1beta1 import api_pb2_grpc as pbg

log = logging.getLogger(__name__)


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
        #: Set in allocate mode ``cdi`` (:mod:`hami.deviceplugin.cdiallocate`): Allocate
        #: names CDI devices and PreStartContainer serves the pods, with no node lock.
        self.cdi: CdiAllocator | None = None
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
    def options(self) -> pb.DevicePluginOptions:
        """The plugin's options (also sent with the registration): PreStartContainer is
        required in allocate mode ``cdi`` only."""
        return pb.DevicePluginOptions(pre_start_required=self.cdi is not None,
                                      get_preferred_allocation_available=True)

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return self.options()

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        seen = -1
        while not self.stop.is_set() and (context is None or context.is_active()):
            with self.state.cond:
                if seen == self.state.version:
                    self.state.cond.wait(timeout=1.0)
                    continue
                first = seen == -1
                seen = self.state.version
                resp = self.state.list_response()
            if first:
                healthy = sum(1 for d in resp.devices if d.health == "Healthy")
                log.info("ListAndWatch: the kubelet is watching; %d devices sent, %d healthy",
                         len(resp.devices), healthy)
            yield resp

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: Any) -> pb.PreStartContainerResponse:
        """Nothing in HAMi's mode; in mode ``cdi`` the container's spec is written here
        (:meth:`.cdiallocate.CdiAllocator.prestart`); an error keeps it from starting."""
        ids = list(request.devices_ids)
        if self.cdi is None or not ids or any("MIG" in i for i in ids):
            return pb.PreStartContainerResponse()
        try:
            pod, container = self.cdi.prestart(ids)
        except al.AllocateError as exc:
            self.stats.failed += 1
            log.error("PreStartContainer %s failed: %s", sorted(ids), exc)
            if context is not None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            raise
        self.stats.served += 1
        log.info("PreStartContainer: %s/%s container %s served", pod.namespace, pod.name,
                 container)
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
        if self.cdi is not None:
            return self.cdi.allocate(reqs)
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
                write_feedback_files(c.feedback_files)
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
