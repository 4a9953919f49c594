"""Node CPU and memory for DRA mode's ``fragmentation-aware`` order.

Extender mode's ledger knows each node's allocatable CPU and memory and what the pods on
it request, which the scorer's CPU/memory terms read (FGD's fit of a task on a node,
hami's stranding term and whole-node guard). DRA mode's objects (slices, claims) do
not: :class:`HostUsage` keeps them from the scheduler's own watches, the Node objects
it keeps (``Engine.nodes``, name -> Node, a new object per event) and every Pod event
(``Engine.pod_observers``). A pod counts on its node (``spec.nodeName``) with its
effective requests as kube-scheduler computes them (the sum over containers, at least
the largest init container) until it is deleted or has ended (``Succeeded``,
``Failed``). Pure (no I/O); pod and node specs are tenant- or kubelet-written, so a
malformed quantity counts as 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hami.core.podobjects import mapping_or_empty
from hami.core.quantity import QuantityError, to_mib, to_milli
from hami.core.request import RequestError, pod_cpu_memory
from hami.core.request import quantity as parse_quantity

#: Pod phases after which a pod holds no CPU or memory.
ENDED = ("Succeeded", "Failed")
#: The most CPU (millicores) or memory (MiB) one pod or node counts with (2**40, the
#: scorer's "unlimited"): larger values are clamped, so sums stay within int64.
MOST = 2**40


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """``(CPU millicores, memory MiB)`` the pod requests (0, 0 when malformed; each
    within 0..:data:`MOST`)."""
    try:
        cpu, mem = pod_cpu_memory(pod)
    except (RequestError, QuantityError, TypeError, ValueError, AttributeError, KeyError):
        return 0, 0
    return min(max(cpu, 0), MOST), min(max(mem, 0), MOST)


def node_allocatable(node: Mapping[str, Any]) -> tuple[int, int]:
    """``(CPU millicores, memory MiB)`` of the Node's ``status.allocatable`` (-1 each
    where absent or malformed: not checked)."""
    alloc = mapping_or_empty(mapping_or_empty(node.get("status")).get("allocatable"))
    out = []
    for name, conv in (("cpu", to_milli), ("memory", to_mib)):
        try:
            out.append(min(max(int(conv(parse_quantity(alloc[name]))), 0), MOST)
                       if name in alloc else -1)
        except (QuantityError, TypeError, ValueError):
            out.append(-1)
    return out[0], out[1]


class HostUsage:
    """Per node allocatable CPU/memory and the requests of the pods bound there.

    ``nodes``: the scheduler's Node objects by name (read at each :meth:`refresh`;
    objects replaced per event). Feed every pod event to :meth:`observe_pod`.
    :attr:`seq` grows at each change; :meth:`changed` lists the nodes changed after a
    given ``seq``.
    """

    def __init__(self, nodes: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self._nodes_source = nodes if nodes is not None else {}
        self._nodes_seen: dict[str, Any] = {}
        self._alloc: dict[str, tuple[int, int]] = {}
        self._pods: dict[str, tuple[str, int, int]] = {}  # uid -> node, cpu, memory
        self._used: dict[str, list[int]] = {}
        self._stamp: dict[str, int] = {}
        self.seq = 0

    def _touch(self, node: str) -> None:
        self.seq += 1
        self._stamp[node] = self.seq

    def observe_pod(self, pod: Mapping[str, Any], deleted: bool) -> None:
        """One Pod event (``deleted``: a DELETED event)."""
        meta, spec = mapping_or_empty(pod.get("metadata")), mapping_or_empty(pod.get("spec"))
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        node = spec.get("nodeName")
        ended = mapping_or_empty(pod.get("status")).get("phase") in ENDED
        now = None
        if not deleted and not ended and isinstance(node, str) and node:
            cpu, mem = pod_requests(pod)
            now = (node, cpu, mem)
        old = self._pods.get(uid)
        if old == now:
            return
        if old is not None:
            used = self._used[old[0]]
            used[0] -= old[1]
            used[1] -= old[2]
            self._touch(old[0])
            del self._pods[uid]
        if now is not None:
            used = self._used.setdefault(now[0], [0, 0])
            used[0] += now[1]
            used[1] += now[2]
            self._pods[uid] = now
            self._touch(now[0])

    def refresh(self) -> None:
        """Read the Node objects again; those that are new objects since the last call
        count as changed."""
        source = self._nodes_source
        for name in [n for n in self._nodes_seen if n not in source]:
            del self._nodes_seen[name]
            self._alloc.pop(name, None)
            self._touch(name)
        for name, node in list(source.items()):
            if self._nodes_seen.get(name) is node:
                continue
            self._nodes_seen[name] = node
            alloc = node_allocatable(mapping_or_empty(node))
            if self._alloc.get(name) != alloc:
                self._alloc[name] = alloc
                self._touch(name)

    def changed(self, since: int) -> list[str]:
        """Names of the nodes changed after ``seq`` ``since``."""
        return [n for n, s in self._stamp.items() if s > since]

    def of(self, node: str) -> tuple[int, int, int, int]:
        """``(CPU total, memory total, CPU used, memory used)`` of a node (millicores,
        MiB; totals -1 for a node whose Node object is not known: not checked)."""
        cpu_total, mem_total = self._alloc.get(node, (-1, -1))
        used = self._used.get(node, (0, 0))
        return cpu_total, mem_total, used[0], used[1]

    def requests_of(self, uid: str) -> tuple[int, int] | None:
        """``(CPU millicores, memory MiB)`` of a bound pod by UID (None: not known)."""
        held = self._pods.get(uid)
        return None if held is None else (held[1], held[2])

    def nodes(self) -> Iterable[str]:
        """Names of the nodes with a known Node object."""
        return self._alloc.keys()
