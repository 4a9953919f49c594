"""``/filter`` of the extender (HAMi v2.10): decide on the cached pod, charge the
ledger, write the allocation in one merge patch (answered before it lands unless
``--async-annotation-patch=false``), and the events of the outcome. For a node whose
device plugin needs no node lock (mode ``cdi``) nothing is written: ``/bind`` writes the
allocation with the Binding (:class:`DeferredAllocation`)."""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.api import names
from hami.core.codec import CodecError, parse_scoring_weights
from hami.core.filter import FilterError
from hami.core.provenance import SIGNATURE, sign
from hami.core.request import RequestError
from hami.core.state import ClusterState, pod_uid
from hami.extender.wire import FilterArgs, filter_result
from hami.kube import KubeError
from hami.scheduler import decisionlog
from hami.scheduler.events import FILTERING_FAILED, FILTERING_SUCCEED, UNKNOWN_SCHEDULER_POLICY
from hami.scheduler.parts import EngineParts
from hami.scheduler.podcache import UnknownPod

JSON = dict[str, Any]
#: A failed filter patch is reported by the pod's bind within this time, then forgotten.
PENDING_PATCH_TTL_S = 600.0


@dataclass(frozen=True, slots=True)
class DeferredAllocation:
    """A filter's allocation for a node whose device plugin needs no node lock (mode
    ``cdi``): not patched onto the pod, but written by ``/bind`` with the Binding.

    ``annotations``: the allocation annotations (``hami.io/vgpu-node``, every vendor's,
    ``hami.io/vgpu-time``, the signature), without the bind's progress marks.
    ``entry``: the ledger charge the filter made (the bind uses the record only while the
    ledger still holds this very charge). ``after``: an earlier filter's patch of the
    same pod still in flight (the Binding waits for it so that it lands last).
    """

    node: str
    annotations: Mapping[str, str]
    entry: Any
    after: asyncio.Future[str] | None = None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _ordered(node_names: list[str] | None) -> list[str] | None:
    """Candidate names sorted: kube-scheduler rotates its node list every cycle, and the
    core breaks score ties by input order, so sorting makes the choice reproducible (the
    offline ``hami schedule`` gives the same answer for nodes listed by name)."""
    return None if node_names is None else sorted(node_names)


_TOKEN = re.compile(r"^(\d+)/(\d+) (\S+)$")


def failure_tokens(failed: Mapping[str, str]) -> dict[str, list[str]]:
    """Nodes per failure token, from GenReason strings (``"1/4 CardInsufficientMemory, ..."``);
    only items of the form ``<n>/<m> <Token>`` count, as in HAMi."""
    out: dict[str, list[str]] = {}
    for node, reason in failed.items():
        for item in reason.split(", "):
            match = _TOKEN.match(item.strip())
            if match:
                out.setdefault(match.group(3), []).append(node)
    return out


class FilterFlow(EngineParts):
    """The engine's ``/filter`` (a mixin of :class:`~hami.scheduler.engine.Engine`)."""

    async def _ready(self, timeout_s: float = 25.0) -> str:
        if not self.synced.is_set():
            try:
                await asyncio.wait_for(self.synced.wait(), timeout_s)
            except TimeoutError:
                return "scheduler caches not synced yet"
        if not self.leader:
            return "this hami scheduler replica is not the leader"
        return ""

    async def filter(self, args: FilterArgs) -> JSON:
        """``/filter``: ExtenderArgs -> ExtenderFilterResult (HAMi v2.10)."""
        started = time.perf_counter()
        outcome = "error"
        try:
            result = await self._filter(args)
            outcome = ("error" if result["Error"] else
                       "unschedulable" if result["FailedNodes"] and not result["NodeNames"]
                       and not result["Nodes"] else "scheduled")
            return result
        finally:
            self.counters.filters += 1
            self.observer.filter_done(time.perf_counter() - started, outcome)

    async def _filter(self, args: FilterArgs) -> JSON:
        if args.nodes is not None:
            return self.simulate(args)
        started = time.perf_counter()
        n = len(args.node_names or ())
        not_ready = await self._ready()
        if not_ready:
            decisionlog.filter_other(_meta(args.pod), "error", not_ready, n)
            return filter_result(error=not_ready)
        try:
            pod = await self.pending.resolve(args.pod, self.kube.get_pod)
        except UnknownPod as exc:
            self.counters.unknown_pods += 1
            decisionlog.filter_other(_meta(args.pod), "error", str(exc), n)
            return filter_result(error=str(exc))
        except KubeError as exc:
            decisionlog.filter_other(_meta(args.pod), "error", exc.message, n)
            return filter_result(error=f"cannot read the pod: {exc.message}")
        meta = _meta(pod)
        weights = (meta.get("annotations") or {}).get(names.DEVICE_SCORING_WEIGHTS)
        self.expire_reservations()
        reserved, waiting = self.preemption_gate(pod_uid(pod))
        if waiting and await self.confirm_victims(pod_uid(pod)):
            reserved, waiting = self.preemption_gate(pod_uid(pod))
        if waiting:  # its preemption's victims are still leaving: the slice stays reserved
            failed = {n: waiting for n in args.node_names or [reserved or ""]}
            decisionlog.filter_unschedulable(meta, failed, n, time.perf_counter() - started)
            return filter_result(failed=failed)
        try:
            if weights is not None:
                parse_scoring_weights(str(weights))  # before the core drops an earlier charge
            decision = None
            if reserved is not None and (args.node_names is None or reserved in args.node_names):
                decision = self._decide(pod, [reserved])  # the slice it preempted for
                if decision.result.node is None:
                    decision = None
            if decision is None:
                decision = self._decide(pod, _ordered(args.node_names))
        except (RequestError, FilterError, CodecError) as exc:
            self.events.emit(meta, FILTERING_FAILED, str(exc), warning=True)
            decisionlog.filter_other(meta, "error", str(exc), n)
            return filter_result(error=str(exc))
        result = decision.result
        for warning in result.policy_warnings:
            self.events.emit(meta, UNKNOWN_SCHEDULER_POLICY, warning, warning=True)
        if result.passthrough:
            self.pending.filtered(pod_uid(pod))
            decisionlog.filter_other(meta, "passthrough", candidates=n)
            return filter_result(node_names=args.node_names)
        if result.node is None:
            self._unschedulable_events(meta, result.failed_nodes, n)
            decisionlog.filter_unschedulable(meta, result.failed_nodes, n,
                                             time.perf_counter() - started)
            note = await self.maybe_preempt(pod, args.node_names)
            if note:
                return filter_result(failed={node: f"{reason}; {note}" for node, reason
                                             in result.failed_nodes.items()})
            return filter_result(failed=result.failed_nodes)
        uid = pod_uid(pod)
        now_s = str(int(time.time()))
        annotations = {**decision.annotations, names.VGPU_TIME: now_s}
        if self.keyring is not None:
            annotations[SIGNATURE] = sign(self.keyring.signing_key(), uid, result.node,
                                          annotations)
        entry = self.state.commit(pod, decision)
        self._committed_at[uid] = time.monotonic()
        self.inflight.add(uid, result.node)
        self.pending.filtered(uid)
        success = (f"find fit node({result.node}), {n - 1} nodes not fit, 1 nodes "
                   f"fit({result.node}:{result.score:.2f})")
        if self.lock_free(result.node):
            # No pod write: the allocation rides on the Binding (one write fewer per pod);
            # until then the charge lives in the ledger only.
            self._deferred[uid] = DeferredAllocation(
                result.node, annotations, entry, self._pending_patch.pop(uid, None))
            decisionlog.filter_placed(meta, result.node, decision.annotations, result.score,
                                      n, time.perf_counter() - started)
            self.events.emit(meta, FILTERING_SUCCEED, success, warning=False)
            return filter_result(node_names=[result.node])
        self._deferred.pop(uid, None)
        # The bind's progress marks ride on this patch (HAMi writes them at /bind, one more
        # pod write per pod): device plugins only look at pods bound to their node, and
        # only a bind that holds the node lock writes the Binding.
        annotations.update({names.BIND_PHASE: "allocating", names.BIND_TIME: now_s})
        # The UID makes the patch a precondition: a pod recreated under the same name
        # in between is refused by the API server (the UID is immutable).
        patch = {"metadata": {"uid": uid, "annotations": annotations,
                              "labels": {names.VGPU_NODE: result.node}}}
        decisionlog.filter_placed(meta, result.node, decision.annotations, result.score, n,
                                  time.perf_counter() - started)
        write = self._write_allocation(meta, uid, entry, patch, success,
                                       self._pending_patch.get(uid))
        if self.settings.async_annotation_patch:
            # Answer now; the merge patch is on its way and /bind waits for it (a failed
            # write fails the bind, kube-scheduler then filters the pod again).
            task = asyncio.ensure_future(write)
            self._pending_patch[uid] = task
            task.add_done_callback(functools.partial(self._patch_done, uid))
            return filter_result(node_names=[result.node])
        error = await write
        return filter_result(error=error) if error else filter_result(node_names=[result.node])

    async def _write_allocation(self, meta: Mapping[str, Any], uid: str, entry: Any,
                                patch: Mapping[str, Any], success: str,
                                previous: asyncio.Future[str] | None) -> str:
        """The filter's one merge patch (annotations + label); "" or the error. On failure
        the charge is undone unless a newer filter of the same pod replaced it."""
        if previous is not None:  # an older decision for this pod must not land last
            await asyncio.gather(previous, return_exceptions=True)
        try:
            await self.kube.patch_pod(str(meta.get("namespace") or "default"),
                                      str(meta.get("name") or ""), patch)
        except KubeError as exc:
            if self.state.ledger.pod(uid) is entry:
                self.state.remove_pod(uid)
                self._committed_at.pop(uid, None)
                self.inflight.done(uid)
            self.counters.patch_failures += 1
            message = f"patch pod annotations failed: {exc.message}"
            self.events.emit(meta, FILTERING_FAILED, message, warning=True)
            return message
        self._phase_written.add(uid)
        self.events.emit(meta, FILTERING_SUCCEED, success, warning=False)
        return ""

    def _patch_done(self, uid: str, task: asyncio.Future[str]) -> None:
        """A written patch is forgotten; a failed one stays until the bind (which then
        fails) or the next filter of the pod, or its deletion, consumes it."""
        failed = task.cancelled() or task.exception() is not None or bool(task.result())
        if self._pending_patch.get(uid) is not task:
            return
        if not failed:
            del self._pending_patch[uid]
        else:  # kept for the bind to report, but not for ever (a pod that never binds)
            asyncio.get_running_loop().call_later(
                PENDING_PATCH_TTL_S, self._expire_patch, uid, task)

    def _expire_patch(self, uid: str, task: asyncio.Future[str]) -> None:
        if self._pending_patch.get(uid) is task:
            del self._pending_patch[uid]

    def _unschedulable_events(self, meta: Mapping[str, Any], failed: Mapping[str, str],
                              n: int) -> None:
        """HAMi's FilteringFailed events: one per failure token, then the summary (HAMi v2.10)."""
        for token, nodes in sorted(failure_tokens(failed).items()):
            self.events.emit(meta, FILTERING_FAILED,
                             f"{len(nodes)} nodes {token}({','.join(sorted(nodes))})",
                             warning=True)
        self.events.emit(meta, FILTERING_FAILED, f"no available node, {n} nodes do not meet",
                         warning=True)

    def simulate(self, args: FilterArgs) -> JSON:
        """Full ``Nodes`` in the args: decide on those nodes alone, with zero usage and no
        side effects (HAMi v2.10)."""
        scratch = ClusterState(self.config)
        assert args.nodes is not None
        names_in = []
        for node in args.nodes:
            name = str(_meta(node).get("name") or "")
            names_in.append(name)
            scratch.upsert_node(node)
        try:
            decision = scratch.filter(args.pod, names_in)
        except (RequestError, FilterError, CodecError) as exc:
            return filter_result(error=str(exc))
        result = decision.result
        if result.passthrough:
            return filter_result(nodes=list(args.nodes), nodes_list=True)
        if result.node is None:
            return filter_result(failed=result.failed_nodes)
        best = next(n for n in args.nodes if _meta(n).get("name") == result.node)
        return filter_result(nodes=[best], nodes_list=True, failed=result.failed_nodes)
