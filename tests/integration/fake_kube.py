"""An in-memory stand-in for :class:`hami.kube.Kube` (the engine's KubeApi protocol).

It keeps objects as JSON dicts with resourceVersions, applies JSON merge patches with the
apiserver's resourceVersion precondition (409 on a stale one), binds pods (409 when
already bound), records events, and feeds watches from per-watcher queues; a test can
break a watch (``break_watches``) or hide a delete from it (``delete(..., silent=True)``)
to exercise relisting.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from hami.kube import KubeError

JSON = dict[str, Any]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _key(kind: str, obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    ns = "" if kind == "Node" else str(meta.get("namespace") or "default")
    return ns, str(meta.get("name"))


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[tuple[str, str], JSON]] = {
            "Node": {}, "Pod": {}, "ResourceQuota": {}}
        self._rv = itertools.count(1)
        self.version = 0
        self._watchers: dict[str, list[asyncio.Queue[Any]]] = {k: [] for k in self.objects}
        self.events: list[JSON] = []
        self.leases: dict[tuple[str, str], JSON] = {}
        self.calls: list[str] = []
        #: the API server copies a Binding's labels onto the pod (Kubernetes 1.33+)
        self.binding_labels = True
        #: PodDisruptionBudgets (policy/v1 JSON) the Eviction API checks.
        self.pdbs: list[JSON] = []
        #: Evictions asked for, as (namespace, name).
        self.evictions: list[tuple[str, str]] = []
        #: False: an eviction only marks the pod Terminating (a grace period running).
        self.evict_deletes = True
        self.fail: dict[str, KubeError] = {}

    # ------------------------------------------------------------ test side
    def put(self, kind: str, obj: Mapping[str, Any]) -> JSON:
        obj = copy.deepcopy(dict(obj))
        key = _key(kind, obj)
        event = "MODIFIED" if key in self.objects[kind] else "ADDED"
        meta = obj.setdefault("metadata", {})
        if kind == "Pod":
            meta.setdefault("uid", f"uid-{key[0]}-{key[1]}")
            meta.setdefault("namespace", key[0])
        self.version = next(self._rv)
        meta["resourceVersion"] = str(self.version)
        self.objects[kind][key] = obj
        self._notify(kind, event, obj)
        return obj

    def delete(self, kind: str, obj_or_key: Any, *, silent: bool = False) -> None:
        key = obj_or_key if isinstance(obj_or_key, tuple) else _key(kind, obj_or_key)
        obj = self.objects[kind].pop(key)
        self.version = next(self._rv)
        if not silent:
            self._notify(kind, "DELETED", obj)

    def pod(self, name: str, namespace: str = "default") -> JSON:
        return self.objects["Pod"][(namespace, name)]

    def node(self, name: str) -> JSON:
        return self.objects["Node"][("", name)]

    def break_watches(self, code: int = 410) -> None:
        for queues in self._watchers.values():
            for q in queues:
                q.put_nowait(KubeError(code, "too old resource version"))

    def _notify(self, kind: str, event: str, obj: JSON) -> None:
        for q in self._watchers[kind]:
            q.put_nowait((event, copy.deepcopy(obj)))

    def _check(self, op: str) -> None:
        self.calls.append(op)
        if op in self.fail:
            raise self.fail[op]

    # ----------------------------------------------------------- KubeApi
    async def list(self, kind: str, on_item: Callable[[JSON], None]) -> str:
        self._check(f"list {kind}")
        version = str(self.version)
        for obj in [copy.deepcopy(o) for o in self.objects[kind].values()]:
            on_item(obj)
        return version

    async def watch(self, kind: str, resource_version: str) -> AsyncIterator[tuple[str, JSON]]:
        q: asyncio.Queue[Any] = asyncio.Queue()
        self._watchers[kind].append(q)
        try:
            while True:
                item = await q.get()
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self._watchers[kind].remove(q)

    async def get_node(self, name: str) -> JSON:
        self._check("get node")
        try:
            return copy.deepcopy(self.objects["Node"][("", name)])
        except KeyError:
            raise KubeError(404, f'nodes "{name}" not found') from None

    async def get_pod(self, namespace: str, name: str) -> JSON | None:
        self._check("get pod")
        obj = self.objects["Pod"].get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    async def _patch(self, kind: str, key: tuple[str, str], patch: Mapping[str, Any]) -> JSON:
        await asyncio.sleep(0)
        current = self.objects[kind].get(key)
        if current is None:
            raise KubeError(404, f"{kind} {key[1]} not found")
        want = (patch.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != current["metadata"]["resourceVersion"]:
            raise KubeError(409, "the object has been modified")
        uid = (patch.get("metadata") or {}).get("uid")
        if uid is not None and uid != current["metadata"].get("uid"):
            raise KubeError(422, "metadata.uid: Invalid value: field is immutable")
        return self.put(kind, merge_patch(current, patch))

    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        self._check("patch pod")
        return await self._patch("Pod", (namespace, name), patch)

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> JSON:
        self._check("patch node")
        return await self._patch("Node", ("", name), patch)

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str] | None = None,
                   labels: Mapping[str, str] | None = None) -> None:
        self._check("bind")
        pod = self.objects["Pod"].get((namespace, name))
        if pod is None:
            raise KubeError(404, f'pods "{name}" not found')
        if uid and uid != pod["metadata"].get("uid"):
            raise KubeError(409, f"Precondition failed: UID in precondition: {uid}, "
                                 f"UID in object meta: {pod['metadata'].get('uid')}")
        if (pod.get("spec") or {}).get("nodeName"):
            raise KubeError(409, f"pod {name} is already assigned to node")
        # As the API server (1.33+): the Binding's annotations and labels land with
        # spec.nodeName, in one write; before 1.33 (binding_labels False) the labels not.
        self.put("Pod", merge_patch(pod, {"spec": {"nodeName": node}, "metadata": {
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}) if self.binding_labels else {}}}))

    async def create_event(self, event: Mapping[str, Any]) -> None:
        self.events.append(dict(event))

    async def list_pdbs(self) -> list[JSON]:
        self._check("list pdbs")
        return copy.deepcopy(self.pdbs)

    async def evict(self, namespace: str, name: str, uid: str) -> None:
        """The Eviction API: 404 when gone, 409 on a UID mismatch, 429 when a budget of
        the pod allows no disruption; otherwise the pod is deleted (grace period 0)."""
        from hami.core.podpriority import Budget

        self._check("evict")
        await asyncio.sleep(0)
        pod = self.objects["Pod"].get((namespace, name))
        if pod is None:
            raise KubeError(404, f'pods "{name}" not found')
        if uid and uid != pod["metadata"].get("uid"):
            raise KubeError(409, "Precondition failed: UID mismatch")
        for pdb in self.pdbs:
            budget = Budget.from_object(pdb)
            if budget.covers(pod):
                if budget.allowed <= 0:
                    raise KubeError(429, "Cannot evict pod as it would violate the pod's "
                                         "disruption budget.")
                pdb.setdefault("status", {})["disruptionsAllowed"] = budget.allowed - 1
        self.evictions.append((namespace, name))
        if self.evict_deletes:
            self.delete("Pod", (namespace, name))
        else:
            self.put("Pod", merge_patch(pod, {"metadata": {
                "deletionTimestamp": "2026-01-01T00:00:00Z"}}))

    async def patch_pod_status(self, namespace: str, name: str,
                               patch: Mapping[str, Any]) -> JSON:
        self._check("patch pod status")
        return await self._patch("Pod", (namespace, name), {"status": patch.get("status")})

    async def get_lease(self, namespace: str, name: str) -> JSON | None:
        lease = self.leases.get((namespace, name))
        return copy.deepcopy(lease) if lease else None

    async def create_lease(self, namespace: str, name: str, spec: Mapping[str, Any]) -> JSON:
        if (namespace, name) in self.leases:
            raise KubeError(409, "exists")
        self.leases[(namespace, name)] = {"metadata": {"resourceVersion": str(next(self._rv))},
                                          "spec": dict(spec)}
        return self.leases[(namespace, name)]

    async def replace_lease(self, namespace: str, name: str, spec: Mapping[str, Any],
                            resource_version: str) -> JSON:
        lease = self.leases.get((namespace, name))
        if lease is None or lease["metadata"]["resourceVersion"] != resource_version:
            raise KubeError(409, "conflict")
        self.leases[(namespace, name)] = {"metadata": {"resourceVersion": str(next(self._rv))},
                                          "spec": dict(spec)}
        return self.leases[(namespace, name)]
