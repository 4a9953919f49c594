"""What preemption reads from Pods and PodDisruptionBudgets, pure.

Sources: Kubernetes API reference (``PodSpec.priority``, ``PodSpec.preemptionPolicy``,
``PodStatus.startTime``, ``PodDisruptionBudget``; LabelSelector semantics of
``metav1.LabelSelector``) and kube-scheduler's default preemption
(``pkg/scheduler/framework/plugins/defaultpreemption``, Kubernetes v1.37): a pod may
preempt unless its ``preemptionPolicy`` is ``Never``; a PDB counts for a pod of its
namespace that its non-empty selector matches, unless the pod is already in the PDB's
``status.disruptedPods``.

Every input is a JSON-shaped mapping written by someone else (the pod by a tenant):
malformed fields read as "unknown" (priority 0, no start time, a selector that matches
nothing), never as an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hami.core.podobjects import meta_of, pod_uid

#: ``preemptionPolicy`` value that forbids a pod to preempt (Kubernetes API).
NEVER = "Never"
#: The bounds of ``PodSpec.priority`` (int32).
_INT32 = (-(2**31), 2**31 - 1)


def pod_priority(pod: Mapping[str, Any]) -> int:
    """``spec.priority`` (set by the API server from the PriorityClass), 0 when absent or
    not an int32 (Kubernetes' default priority without a global default class)."""
    spec = pod.get("spec")
    value = spec.get("priority") if isinstance(spec, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return value if _INT32[0] <= value <= _INT32[1] else 0


def may_preempt(pod: Mapping[str, Any]) -> bool:
    """Whether the pod may preempt others: ``spec.preemptionPolicy`` is not ``Never``
    (absent means ``PreemptLowerPriority``)."""
    spec = pod.get("spec")
    return not (isinstance(spec, Mapping) and spec.get("preemptionPolicy") == NEVER)


def rfc3339_ns(value: Any) -> int | None:
    """An RFC 3339 timestamp with a zone -> Unix ns; None when it is not one."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        return None
    return int(stamp.timestamp()) * 1_000_000_000 + stamp.microsecond * 1000


def start_ns(pod: Mapping[str, Any]) -> int | None:
    """``status.startTime`` in Unix ns, else ``metadata.creationTimestamp``; None when
    neither parses (RFC 3339 with a zone)."""
    status = pod.get("status")
    started = rfc3339_ns(status.get("startTime")) if isinstance(status, Mapping) else None
    return started if started is not None else rfc3339_ns(meta_of(pod).get("creationTimestamp"))


def selector_matches(selector: Any, labels: Mapping[str, Any]) -> bool:
    """``metav1.LabelSelector`` semantics over ``labels``: every ``matchLabels`` pair and
    every ``matchExpressions`` requirement (In, NotIn, Exists, DoesNotExist) holds. A
    missing or empty selector matches nothing here (a PDB with an empty selector is
    skipped by kube-scheduler's preemption), and so does a malformed one."""
    if not isinstance(selector, Mapping):
        return False
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping) or not isinstance(expressions, list):
        return False
    if not match_labels and not expressions:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for req in expressions:
        if not isinstance(req, Mapping):
            return False
        key, op, values = req.get("key"), req.get("operator"), req.get("values") or []
        if not isinstance(key, str) or not isinstance(values, list):
            return False
        present = key in labels
        if op == "In":
            ok = present and labels[key] in values
        elif op == "NotIn":
            ok = not present or labels[key] not in values
        elif op == "Exists":
            ok = present
        elif op == "DoesNotExist":
            ok = not present
        else:
            return False
        if not ok:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Budget:
    """One PodDisruptionBudget as preemption counts it.

    ``key``: ``namespace/name``. ``allowed``: ``status.disruptionsAllowed`` (0 when absent
    or malformed). ``disrupted``: names in ``status.disruptedPods`` (evictions already
    under way, which do not count again).
    """

    key: str
    namespace: str
    selector: Any
    allowed: int
    disrupted: frozenset[str]

    @classmethod
    def from_object(cls, pdb: Mapping[str, Any]) -> Budget:
        """A ``policy/v1`` PodDisruptionBudget (JSON) -> :class:`Budget`."""
        meta = meta_of(pdb)
        namespace = str(meta.get("namespace") or "default")
        spec = pdb.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        status = pdb.get("status")
        status = status if isinstance(status, Mapping) else {}
        allowed = status.get("disruptionsAllowed")
        disrupted = status.get("disruptedPods")
        return cls(f"{namespace}/{meta.get('name') or ''}", namespace,
                   spec.get("selector"),
                   allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
                   frozenset(str(n) for n in disrupted) if isinstance(disrupted, Mapping)
                   else frozenset())

    def covers(self, pod: Mapping[str, Any]) -> bool:
        """The budget counts an eviction of ``pod`` (same namespace, selector matches,
        not already disrupted)."""
        meta = meta_of(pod)
        labels = meta.get("labels")
        return (str(meta.get("namespace") or "default") == self.namespace
                and str(meta.get("name") or "") not in self.disrupted
                and selector_matches(self.selector, labels if isinstance(labels, Mapping) else {}))


@dataclass(frozen=True, slots=True)
class PodPriority:
    """What preemption knows of a pod holding devices.

    ``priority``: ``spec.priority``. ``start_ns``: start time (Unix ns; None unknown,
    which counts as the latest). ``budgets``: keys of the PDBs that cover it.
    """

    uid: str
    priority: int
    start_ns: int | None = None
    budgets: tuple[str, ...] = ()


def pod_priority_info(pod: Mapping[str, Any], budgets: Sequence[Budget] = ()) -> PodPriority:
    """A pod (JSON) -> :class:`PodPriority`, with the keys of ``budgets`` that cover it."""
    return PodPriority(pod_uid(pod), pod_priority(pod), start_ns(pod),
                       tuple(b.key for b in budgets if b.covers(pod)))


__all__ = ["NEVER", "Budget", "PodPriority", "may_preempt", "pod_priority",
           "pod_priority_info", "rfc3339_ns", "selector_matches", "start_ns"]
