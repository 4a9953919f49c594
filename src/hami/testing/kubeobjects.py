"""API objects for the test control plane, which runs no kubelet and no
kube-controller-manager: namespaces with their ``default`` ServiceAccount, GPU nodes and
their status (the node-lifecycle controller's Ready taint removal), pod bindings (what
kube-scheduler does) and pod phases (what a kubelet would report).
"""

from __future__ import annotations

import datetime as _dt
import functools
import time
from collections.abc import Mapping
from typing import Any

from hami.testing.processes import POLL_S


def ensure_namespace(client: Any, name: str, *, timeout_s: float = 30.0) -> None:
    """Make sure namespace ``name`` and its ``default`` ServiceAccount exist.

    Without kube-controller-manager nobody creates the ``default`` ServiceAccount, and
    the ServiceAccount admission plugin rejects pods in a namespace that lacks it.

    Args:
        client: a ``lightkube.Client``.
        name: namespace name.
        timeout_s: how long to retry while the apiserver's own bootstrap is still
            creating the namespace (conflicts) or the namespace is terminating.

    Raises:
        lightkube.ApiError: an error other than AlreadyExists.
    """
    from lightkube import ApiError
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace, ServiceAccount

    for obj in (
        Namespace(metadata=ObjectMeta(name=name)),
        ServiceAccount(metadata=ObjectMeta(name="default", namespace=name)),
    ):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.create(obj)
                break
            except ApiError as err:
                if err.status.code == 409:  # AlreadyExists
                    break
                if err.status.code in (403, 404) and time.monotonic() < deadline:
                    time.sleep(POLL_S)  # namespace not there yet / being bootstrapped
                    continue
                raise


def node_ready_condition(now: _dt.datetime | None = None) -> dict[str, str]:
    """A ``Ready=True`` NodeCondition dict with heartbeat/transition times ``now`` (UTC)."""
    stamp = (now or _dt.datetime.now(_dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "hami e2e: node object without a kubelet",
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }


def create_gpu_node(
    client: Any,
    name: str,
    *,
    gpus: int,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    extra_capacity: Mapping[str, str] | None = None,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: str = "110",
) -> Any:
    """Create a Node with ``nvidia.com/gpu`` capacity through the API and mark it Ready.

    The node is what a HAMi device plugin's node looks like to the scheduler: the given
    annotations (e.g. ``hami.io/node-nvidia-register``), capacity = allocatable =
    ``{cpu, memory, pods, nvidia.com/gpu: gpus, **extra_capacity}``, and a Ready=True
    condition, written through the status subresource (a create ignores most status).

    Args:
        client: a ``lightkube.Client``.
        name: node name (also its ``kubernetes.io/hostname`` label).
        gpus: value of ``nvidia.com/gpu`` (HAMi advertises GPUs x device-split-count).
        annotations, labels: extra metadata.
        extra_capacity: more resources, quantity strings (e.g. ``{"nvidia.com/gpumem": "..."}``).
        cpu, memory, pods: quantity strings of the ordinary resources.

    Returns:
        The Node as returned by the status patch (a lightkube ``Node``).

    Raises:
        lightkube.ApiError: e.g. 409 when a node of that name exists.
    """
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Node

    all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
    all_labels.update(labels or {})
    client.create(
        Node(metadata=ObjectMeta(name=name, labels=all_labels, annotations=dict(annotations or {})))
    )
    resources = {"cpu": cpu, "memory": memory, "pods": pods, "nvidia.com/gpu": str(gpus)}
    resources.update(extra_capacity or {})
    return set_node_status(client, name, capacity=resources)


#: Taint the apiserver puts on new nodes and the node-lifecycle controller manages.
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def set_node_status(
    client: Any, name: str, *, capacity: Mapping[str, str] | None = None, ready: bool = True,
    attempts: int = 20,
) -> Any:
    """Patch a Node's status (capacity/allocatable when given, Ready condition) and taints.

    Does what kubelet and the node-lifecycle controller would do together: the Ready
    condition gets ``status`` ``"True"``/``"False"`` with fresh heartbeat times, and the
    ``node.kubernetes.io/not-ready:NoSchedule`` taint is removed (ready) or added (not
    ready). Nothing in :class:`ControlPlane` checks heartbeats, so one call suffices.

    The status goes in one strategic merge patch (no resourceVersion: it cannot
    conflict). ``spec.taints`` has no merge key, so a patch replaces the whole list: it
    carries the resourceVersion it was computed from, and when another writer changed
    the node in between (hami's scheduler writes its handshake annotation as soon as it
    sees a new node) the apiserver answers 409 and the taints are computed again from a
    fresh read, as client-go's ``RetryOnConflict`` does.

    Args:
        client: a ``lightkube.Client``.
        name: the node.
        capacity: resource name -> quantity string, written to capacity and allocatable.
        ready: the Ready condition to report.
        attempts: taint patches to try before a conflict is raised.

    Returns:
        The Node after both patches.

    Raises:
        ValueError: ``attempts`` below 1.
        lightkube.ApiError: e.g. 404 for an unknown node; 409 when every one of
            ``attempts`` taint patches met a concurrent change.
    """
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Node
    from lightkube.types import PatchType

    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    condition = node_ready_condition()
    if not ready:
        condition.update(status="False", reason="KubeletNotReady")
    status: dict[str, Any] = {"conditions": [condition]}
    if capacity is not None:
        status["capacity"] = dict(capacity)
        status["allocatable"] = dict(capacity)
    node = client.patch(Node.Status, name, {"status": status}, patch_type=PatchType.STRATEGIC)
    for attempt in range(attempts):
        if attempt:
            node = client.get(Node, name)  # the node as the conflicting writer left it
        taints = [t.to_dict() for t in (node.spec.taints or []) if t.key != NOT_READY_TAINT]
        if not ready:
            taints.append({"key": NOT_READY_TAINT, "effect": "NoSchedule"})
        if len(taints) == len(node.spec.taints or []) and ready:
            return node  # no not-ready taint to remove
        patch = {
            "metadata": {"resourceVersion": node.metadata.resourceVersion},  # 409 on a race
            "spec": {"taints": taints or None},
        }
        try:
            return client.patch(Node, name, patch, patch_type=PatchType.MERGE)
        except ApiError as err:
            if err.status.code != 409 or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


@functools.cache
def _pod_binding_class() -> type[Any]:
    from lightkube.core import resource as lkres
    from lightkube.generic_resource import Generic
    from lightkube.resources.core_v1 import PodBinding

    # Both bases define apiVersion/kind; Generic's dict-backed ones are the ones used.
    class PodBindingRequest(lkres.NamespacedSubResource, Generic):  # type: ignore[misc]
        _api_info = PodBinding._api_info

    return PodBindingRequest


def pod_binding(name: str, namespace: str, node: str) -> Any:
    """A ``pods/binding`` request object for ``client.create(obj, name=..., namespace=...)``.

    Works with ``lightkube.Client`` and ``AsyncClient``. lightkube's own ``PodBinding``
    cannot be used: the apiserver answers a binding with a ``metav1.Status`` while the
    OpenAPI spec (and so lightkube's model) says ``Binding``, and decoding that reply
    fails on the missing ``target``. This object's reply decodes as a plain dict.
    """
    from lightkube.models.meta_v1 import ObjectMeta

    return _pod_binding_class()(
        apiVersion="v1",
        kind="Binding",
        metadata=ObjectMeta(name=name, namespace=namespace),
        target={"apiVersion": "v1", "kind": "Node", "name": node},
    )


def bind_pod(client: Any, name: str, namespace: str, node: str) -> None:
    """Bind pod ``namespace/name`` to ``node`` as a scheduler does (``pods/binding``).

    Raises:
        lightkube.ApiError: e.g. 409 when the pod is already bound, 404 for no pod.
    """
    client.create(pod_binding(name, namespace, node), name=name, namespace=namespace)


def node_is_ready(node: Any) -> bool:
    """True when a lightkube ``Node`` has condition Ready=True."""
    for cond in (node.status.conditions if node.status else None) or []:
        if cond.type == "Ready":
            return bool(cond.status == "True")
    return False


def set_pod_phase(client: Any, name: str, namespace: str, phase: str) -> Any:
    """Set a pod's ``status.phase`` as its kubelet would (no kubelet runs here).

    Args:
        client: a ``lightkube.Client``.
        name, namespace: the pod.
        phase: ``Pending``, ``Running``, ``Succeeded``, ``Failed`` or ``Unknown``.

    Returns:
        The patched Pod.

    Raises:
        ValueError: an unknown phase.
        lightkube.ApiError: e.g. 404 for no such pod; 422 for a transition the apiserver
            refuses (a pod cannot leave ``Succeeded``/``Failed``).
    """
    from lightkube.resources.core_v1 import Pod
    from lightkube.types import PatchType

    if phase not in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
        raise ValueError(f"unknown pod phase {phase!r}")
    return client.patch(
        Pod.Status,
        name,
        {"status": {"phase": phase}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )


# -- command line ---------------------------------------------------------------------------
