"""``/bind`` of the extender (HAMi v2.10): node lock(s), then the Binding; and where the
filter should not send a burst (nodes with a bind in flight). To a node whose device
plugin needs no lock (mode ``cdi``) the Binding carries the allocation the filter did
not write (:class:`~hami.scheduler.filterflow.DeferredAllocation`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from hami.api import names
from hami.core.codec import CodecError, served_pod_devices
from hami.extender.wire import BindArgs
from hami.kube import KubeError
from hami.scheduler import decisionlog
from hami.scheduler.binder import LockError, NodeLocks, acquire_all
from hami.scheduler.events import BINDING_FAILED, BINDING_SUCCEED
from hami.scheduler.filterflow import DeferredAllocation
from hami.scheduler.parts import EngineParts

log = logging.getLogger(__name__)

JSON = dict[str, Any]


def _refused(exc: Exception) -> bool:
    """The bind certainly wrote nothing: a lock not taken, or an API answer 4xx (a
    transport failure or a 5xx may still have written the Binding; the pod watch then
    brings the bound pod and its allocation)."""
    return not isinstance(exc, KubeError) or 400 <= exc.code < 500


class BindFlow(EngineParts):
    """The engine's ``/bind`` (a mixin of :class:`~hami.scheduler.engine.Engine`)."""

    async def bind(self, args: BindArgs) -> JSON:
        """``/bind``: node lock, bind-phase, Binding (HAMi v2.10)."""
        started = time.perf_counter()
        error = "error"
        try:
            reply = await self._bind(args)
            error = "error" if reply["Error"] else "bound"
            return reply
        finally:
            self.counters.binds += 1
            self.observer.bind_done(time.perf_counter() - started, error)

    def _bind_refusal(self, args: BindArgs) -> str:
        """Why ``/bind`` must not bind this pod ("" when it may): only a pod with a UID
        (the Binding carries it as a precondition) that this scheduler charged on that
        node, or that this replica's ``/filter`` passed through, is bound."""
        who = f"pod {args.pod_namespace or 'default'}/{args.pod_name}"
        if not args.pod_uid:
            return f"{who}: the bind request carries no pod UID"
        entry = self.state.ledger.pod(args.pod_uid)
        if entry is not None:
            if entry.node != args.node:
                return f"{who} was placed on node {entry.node}, not {args.node}"
            return ""
        if self.pending.was_filtered(args.pod_uid):
            return ""
        return f"{who} with UID {args.pod_uid} was not filtered by this scheduler"

    async def _bind(self, args: BindArgs) -> JSON:
        started = time.perf_counter()
        try:
            reply, lock_wait_s = await self._bind_locked(args)
        finally:
            self.inflight.done(args.pod_uid)  # bound (the node lock shows it) or failed
        decisionlog.bind(args.pod_namespace or "default", args.pod_name, args.node,
                         lock_wait_s, str(reply["Error"]), time.perf_counter() - started)
        return reply

    async def _bind_locked(self, args: BindArgs) -> tuple[JSON, float]:
        """The bind's reply and the seconds it waited for the node lock(s)."""
        not_ready = await self._ready()
        if not_ready:
            return {"Error": not_ready}, 0.0
        ns = args.pod_namespace or "default"
        meta = {"namespace": ns, "name": args.pod_name, "uid": args.pod_uid}
        refusal = self._bind_refusal(args)
        if refusal:
            self.counters.unknown_pods += 1
            return {"Error": refusal}, 0.0
        pending = self._pending_patch.pop(args.pod_uid, None)
        if pending is not None:
            error = (await asyncio.gather(pending, return_exceptions=True))[0]
            if error:
                message = str(error)
                self.events.emit(meta, BINDING_FAILED, message, warning=True)
                return {"Error": message}, 0.0
        entry = self.state.ledger.pod(args.pod_uid)
        deferred = self._deferred.pop(args.pod_uid, None)
        if deferred is not None and (deferred.entry is not entry or deferred.node != args.node):
            deferred = None  # the charge it was made for is gone or was replaced
        held: list[NodeLocks] = []
        lock_started = time.perf_counter()
        lock_wait_s = 0.0
        written = False  # something of this bind reached the pod
        try:
            held = await acquire_all(self._bind_locks(entry, args.node), args.node, ns,
                                     args.pod_name)
            lock_wait_s = time.perf_counter() - lock_started
            if deferred is not None:
                if deferred.after is not None:  # an older filter's patch must land first
                    await asyncio.gather(deferred.after, return_exceptions=True)
                annotations = {**deferred.annotations, names.BIND_PHASE: "allocating",
                               names.BIND_TIME: str(int(time.time()))}
                labels = {names.VGPU_NODE: args.node}
                if self.lock_free(args.node):
                    annotations.update(self._final_marks(args.pod_uid, deferred))
                    await self.kube.bind(ns, args.pod_name, args.pod_uid, args.node,
                                         annotations=annotations, labels=labels)
                    if not self.binding_copies_labels:
                        await self._label_after_binding(ns, args.pod_name, args.pod_uid, labels)
                else:  # back to the lock since the filter: HAMi's order
                    await self.kube.patch_pod(ns, args.pod_name, {"metadata": {
                        "uid": args.pod_uid, "annotations": annotations, "labels": labels}})
                    written = True
                    await self.kube.bind(ns, args.pod_name, args.pod_uid, args.node)
            else:
                if entry is not None and args.pod_uid not in self._phase_written:
                    # a charge from before a restart: its filter patch may not carry them
                    await self.kube.patch_pod(ns, args.pod_name, {"metadata": {
                        "uid": args.pod_uid, "annotations": {
                            names.BIND_PHASE: "allocating",
                            names.BIND_TIME: str(int(time.time()))}}})
                await self.kube.bind(ns, args.pod_name, args.pod_uid, args.node)
        except (LockError, KubeError) as exc:
            message = exc.message if isinstance(exc, KubeError) else str(exc)
            for locks in reversed(held):  # HAMi releases acquired vendors in reverse
                await locks.release(args.node, ns, args.pod_name)
            if deferred is not None and not written:
                if _refused(exc):
                    self._undo_charge(args.pod_uid, entry)
                else:  # the Binding may have landed: a retried bind writes it again
                    self._deferred.setdefault(args.pod_uid, deferred)
            self.events.emit(meta, BINDING_FAILED, message, warning=True)
            return {"Error": message}, lock_wait_s or time.perf_counter() - lock_started
        self.pending.bound(args.pod_uid)
        self.preemptor_bound(args.pod_uid)
        self._phase_written.discard(args.pod_uid)
        self.events.emit(meta, BINDING_SUCCEED,
                         f"Successfully binding node [{args.node}] to {ns}/{args.pod_name}",
                         warning=False)
        return {"Error": ""}, lock_wait_s

    async def _label_after_binding(self, ns: str, name: str, uid: str,
                                   labels: dict[str, str]) -> None:
        """An older API server (v1.33.13 measured) drops a Binding's labels: write them with
        a patch once the pod is bound. A failure is logged, not returned: the pod is
        bound, and the node's device plugin writes a missing label when it serves the
        pod (:func:`hami.deviceplugin.cdimode.completion_patch`)."""
        try:
            await self.kube.patch_pod(ns, name, {"metadata": {"uid": uid, "labels": labels}})
        except KubeError as exc:
            log.warning("bound %s/%s, but its label patch failed (the device plugin writes "
                        "it): %s", ns, name, exc.message)

    def _final_marks(self, uid: str, deferred: DeferredAllocation) -> dict[str, str]:
        """What the device plugin of a node in mode ``cdi`` would write once it served
        the pod, for the Binding to carry: ``bind-phase=success`` and the to-allocate
        string emptied. In HAMi's protocol ``bind-phase`` is the node lock's handshake
        (the plugin answers ``success``/``failed`` so the lock is released); on such a
        node there is no lock and nothing left for the plugin to choose, so the signed
        allocation is final once the Binding lands, and the plugin writes only a failure
        (:mod:`hami.deviceplugin.cdimode`). Empty (``allocating`` stays) for a pod that
        also holds another vendor's devices (that vendor's plugin follows HAMi's
        handshake), MIG instances (not served in that mode) or no NVIDIA grant."""
        ann = deferred.annotations
        allocated = ann.get(names.DEVICES_ALLOCATED)
        if (not allocated or names.DEVICES_TO_ALLOCATE not in ann
                or names.MIG_ALLOCATIONS in ann or self.state.vendor_devices.get(uid)):
            return {}
        try:
            served = served_pod_devices(allocated)
        except CodecError:
            return {}
        return {names.BIND_PHASE: "success", names.DEVICES_TO_ALLOCATE: served}

    def _undo_charge(self, uid: str, entry: Any) -> None:
        """A refused bind of a deferred allocation left nothing on the pod: release the
        filter's charge (unless a newer filter replaced it); kube-scheduler filters the
        pod again."""
        if entry is not None and self.state.ledger.pod(uid) is entry:
            self.state.remove_pod(uid)
            self._committed_at.pop(uid, None)

    def _all_locks(self) -> list[tuple[str, NodeLocks]]:
        return [(names.NODE_LOCK, self.locks), *self.vendor_locks.items()]

    def _owner_live(self, node: str, namespace: str, name: str) -> bool:
        """The lock owner ``namespace/name`` is a pod this scheduler charges on ``node``
        (the pod watch drops charges of deleted and finished pods)."""
        return any(p.namespace == namespace and p.name == name
                   for p in self.state.ledger.pods_on(node))

    def lock_free(self, node: str) -> bool:
        """The node's hami device plugin finds its pods without the node lock: the Node
        says ``hami.io/node-allocate-mode: cdi`` (exactly; the plugin writes it, see
        :mod:`hami.deviceplugin.cdimode`). A node can only say this of itself, and it
        only spares the binds to that node their NVIDIA lock."""
        node_obj = self.nodes.get(node)
        meta = node_obj.get("metadata") if isinstance(node_obj, dict) else None
        ann = meta.get("annotations") if isinstance(meta, dict) else None
        return isinstance(ann, dict) and ann.get(names.NODE_ALLOCATE_MODE) == names.ALLOCATE_MODE_CDI

    def busy_nodes(self) -> dict[str, int]:
        """Binds in flight per node (nodes without any are left out): pods placed by
        /filter whose /bind has not finished, plus one for a node lock held (as the watch
        or our own lock write shows it) until the device plugin's Allocate releases it.
        Nodes whose plugin needs no lock (:meth:`lock_free`) are never busy: their binds
        do not wait for one another."""
        busy = self.inflight.counts()
        locked = {node for node, _ in self._locked}
        for _, locks in self._all_locks():
            locked.update(locks.locked_by_write())
        for node in locked:
            busy[node] = busy.get(node, 0) + 1
        return {node: n for node, n in busy.items() if not self.lock_free(node)}

    def _decide(self, pod: Mapping[str, Any], node_names: list[str] | None) -> Any:
        """The filter's decision; with ``avoid_busy_nodes``, among the candidates with the
        fewest binds in flight first (:meth:`busy_nodes`: a bind behind others waits for
        the node lock), on all candidates when none of those fits."""
        now_ns = time.time_ns()
        if self.settings.avoid_busy_nodes and node_names:
            busy = self.busy_nodes()
            if busy:
                levels = [busy.get(n, 0) for n in node_names]
                least = min(levels)
                if least < max(levels):
                    calm = [n for n, level in zip(node_names, levels, strict=True)
                            if level == least]
                    decision = self.state.filter(pod, calm, now_ns=now_ns)
                    if decision.result.node is not None:
                        return decision
        return self.state.filter(pod, node_names, now_ns=now_ns)

    def _bind_locks(self, entry: Any, node: str) -> list[NodeLocks]:
        """The node locks a bind takes (HAMi v2.10): per vendor that a regular container
        uses, in CommonWord order, the vendor's own lock or the generic one (taken once:
        it is re-entrant for the same pod anyway). Ours: NVIDIA takes none on a node
        whose plugin needs none (:meth:`lock_free`); another vendor that uses the generic
        lock still takes it."""
        if entry is None:
            return []
        out: list[NodeLocks] = []
        skip_nvidia = self.lock_free(node)
        for word in self.state.lock_vendors(entry.uid):
            if word == names.NVIDIA and skip_nvidia:
                continue
            vendor = self.state.vendors.get(word)
            key = vendor.lock_annotation if vendor is not None else None
            locks = self.vendor_locks.get(key, self.locks) if key else self.locks
            if locks not in out:
                out.append(locks)
        return out
