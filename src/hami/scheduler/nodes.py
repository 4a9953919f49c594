"""The engine's node cache from the node watch, and node (re)registration per vendor
(HAMi v2.10); the health decisions are :mod:`hami.scheduler.registration`'s."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping
from typing import Any

from hami.api import names
from hami.kube import KubeError
from hami.scheduler.parts import EngineParts
from hami.scheduler.registration import check_node

log = logging.getLogger("hami.scheduler")
JSON = dict[str, Any]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _registration_view(node: Mapping[str, Any],
                       locks: frozenset[str] = frozenset({names.NODE_LOCK})) -> Any:
    """What registration reads from a node: everything but the node lock annotations."""
    meta = node["metadata"]
    ann = {k: v for k, v in meta["annotations"].items() if k not in locks}
    status = node["status"]
    return ann, meta["labels"], status["allocatable"], status.get("capacity")


def _slim_node(node: Mapping[str, Any]) -> JSON:
    """What the engine keeps of a Node: name, version, labels, annotations, allocatable
    and capacity (vendors such as Cambricon synthesise devices from capacity, HAMi v2.10),
    and the taints and cordon (DRA mode's preemption checks them before evicting)."""
    meta = _meta(node)
    status = node.get("status") or {}
    spec = node.get("spec") if isinstance(node.get("spec"), Mapping) else {}
    return {"metadata": {"name": meta.get("name"), "resourceVersion": meta.get("resourceVersion"),
                         "labels": dict(meta.get("labels") or {}),
                         "annotations": dict(meta.get("annotations") or {})},
            "spec": {"taints": list((spec or {}).get("taints") or []),
                     "unschedulable": (spec or {}).get("unschedulable") is True},
            "status": {"allocatable": dict(status.get("allocatable") or {}),
                       "capacity": dict(status.get("capacity") or {})}}


class NodeRegistry(EngineParts):
    """The engine's node cache and (re)registration (a mixin of
    :class:`~hami.scheduler.engine.Engine`)."""

    def _selected(self, node: Mapping[str, Any]) -> bool:
        labels = _meta(node).get("labels") or {}
        return all(labels.get(k) == v for k, v in self.settings.node_label_selector.items())

    def _apply_node(self, node: Mapping[str, Any], deleted: bool) -> None:
        name = str(_meta(node).get("name") or "")
        if deleted or not self._selected(node):
            for key, _ in self._all_locks():
                self._locked.discard((name, key))
            self.state.remove_node(name)
            self.nodes.pop(name, None)
            self._registered.pop(name, None)
            self._reported.pop(name, None)
            self.node_reasons.pop(name, None)
            for word in self.state.vendors:
                self._vendor_reported.pop((name, word), None)
        else:
            slim = _slim_node(node)
            old = self.nodes.get(name)
            self.nodes[name] = slim
            rv = str(slim["metadata"].get("resourceVersion") or "")
            annotations = slim["metadata"]["annotations"]
            for key, locks in self._all_locks():
                locks.seen(name, rv)
                if annotations.get(key):
                    self._locked.add((name, key))
                else:
                    self._locked.discard((name, key))
            if old is None or (_registration_view(old, self._lock_keys)
                               != _registration_view(slim, self._lock_keys)):
                self.register(name)  # not for lock-only changes (two per bind)
        self.waiters.changed(name)

    def register(self, name: str) -> None:
        """Health check and (re)registration of one node (HAMi v2.10), per vendor.

        The health check runs every time; the devices are read again (the register
        annotation decoded) only when the cached Node object or the set of healthy vendors
        changed since they were last registered, or the node left the ledger meanwhile:
        re-registering the same object gives the same devices, which the ledger keeps as
        they are, so the periodic pass over every node decodes nothing that did not change.
        """
        node = self.nodes.get(name)
        if node is None:
            return
        now = self.local_now()
        health = check_node(node, self._reported.get(name), now)
        self._reported[name] = health.reported
        handshakes: dict[str, str] = {}
        if health.handshake is not None:
            handshakes[names.NODE_HANDSHAKE] = health.handshake
        if not self.state.vendors:  # NVIDIA only: HAMi's NVIDIA loop, unchanged
            if handshakes and self.leader:
                self._spawn(self._patch_handshake(name, handshakes))
            if not health.healthy:
                self.state.remove_node(name)
                self._registered.pop(name, None)
                self._node_reason(name, health.reason)
                return
            self._node_reason(name, self._upsert(name, node, None))
            return
        healthy = {names.NVIDIA} if health.healthy else set()
        annotations = _meta(node).get("annotations") or {}
        nvidia_present = names.NODE_REGISTER in annotations or names.NODE_HANDSHAKE in annotations
        reasons = [] if health.healthy or not nvidia_present else [f"NVIDIA: {health.reason}"]
        for word, vendor in self.state.vendors.items():
            key = (name, word)
            resource = vendor.resource_names().count
            vh = check_node(node, self._vendor_reported.get(key), now,
                            handshake_key=vendor.handshake_key, resource=resource)
            self._vendor_reported[key] = vh.reported
            # ours: a vendor's handshake is only written on nodes that show that vendor
            # (its register annotation, its handshake or its resource), not on every node
            present = (vh.reported > 0 or vendor.handshake_key in annotations
                       or bool(vendor.register_key and vendor.register_key in annotations))
            if vh.handshake is not None and present and vendor.handshake_key:
                handshakes[vendor.handshake_key] = vh.handshake
            if vh.healthy:
                healthy.add(word)
            elif present:
                reasons.append(f"{word}: {vh.reason}")
        if handshakes and self.leader:
            self._spawn(self._patch_handshake(name, handshakes))
        if not healthy:
            self.state.remove_node(name)
            self._registered.pop(name, None)
            self._node_reason(name, "; ".join(reasons))
            return
        why = self._upsert(name, node, frozenset(healthy))
        skipped = self.state.vendor_reasons.get(name) or {}
        if not why and skipped:  # registered, but some vendor's devices were malformed
            why = "registered without " + "; ".join(skipped[w] for w in sorted(skipped))
        # health reasons of vendors left out are kept even when the node still registers
        self._node_reason(name, "; ".join(r for r in (*reasons, why) if r))

    def _upsert(self, name: str, node: JSON, vendors: frozenset[str] | None) -> str:
        """``state.upsert_node`` unless this very object was registered last with the same
        vendors and the node is still in the ledger (then the reason it returned)."""
        last = self._registered.get(name)
        if (last is not None and last[0] is node and last[1] == vendors
                and self.state.ledger.node(name) is not None):
            return last[2]
        why = self.state.upsert_node(node, vendors=vendors)
        self._registered[name] = (node, vendors, why)
        return why

    def _node_reason(self, name: str, why: str) -> None:
        """Remember why a node is (partly) not registered; log each new reason once."""
        if why and self.node_reasons.get(name) != why:
            log.warning("node %s: %s", name, why)
        self.node_reasons[name] = why

    def register_all(self) -> None:
        for name in list(self.nodes):
            self.register(name)

    async def _register_ticker(self) -> None:
        while True:
            await asyncio.sleep(self.settings.register_interval.total_seconds())
            self.register_all()

    async def _patch_handshake(self, name: str, values: Mapping[str, str]) -> None:
        """One merge patch with every vendor's new handshake value."""
        try:
            await self.kube.patch_node(name, {"metadata": {"annotations": dict(values)}})
        except KubeError as exc:
            log.info("handshake on node %s not written: %s", name, exc)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
