"""The chart's RBAC and admission policies applied for real on the test apiserver (RBAC
authorization, the ValidatingAdmissionPolicy admission plugin), then exercised as a tenant
and as each of hami's service accounts with real tokens (issue 12 §2, §6):

* a tenant cannot set, change or remove a pod's allocation annotations or its
  ``hami.io/vgpu-node`` label: not at creation (in a namespace no webhook selects), not
  by patch, status patch or Binding;
* the hami scheduler's account changes only ``hami.io/`` metadata of pods and nodes (no
  image, no foreign annotation, no finalizer, no node spec) and cannot delete pods;
* the device plugin's account, with a token bound to its pod on node A, changes only pods
  on node A and node A itself; a token not bound to a pod on a node changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import ApiError, codecs
from lightkube.resources.core_v1 import Namespace, Node, Pod, Secret
from lightkube.types import PatchType

from hami.testing.controlplane import (
    ControlPlane,
    create_gpu_node,
    ensure_namespace,
    pod_binding,
)
from tests.deploy.chart import NAMESPACE, render
from tests.deploy.e2e import accounts
from tests.deploy.e2e.accounts import token_client

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("require_helm")]

SCHEDULER_SA, PLUGIN_SA, KUBE_SCHEDULER_SA = (
    "hami-scheduler", "hami-device-plugin", "hami-kube-scheduler")


def refused(call: Callable[[], Any], *words: str) -> str:
    """Run ``call``, which must fail with 403 and a message containing ``words``."""
    with pytest.raises(ApiError) as err:
        call()
    message = str(err.value.status.message)
    assert err.value.status.code == 403, message
    for word in words:
        assert word in message, message
    return message


def merge(client: Any, kind: Any, name: str, patch: dict[str, Any],
          namespace: str | None = None) -> Any:
    kwargs = {"namespace": namespace} if namespace else {}
    return client.patch(kind, name, patch, patch_type=PatchType.MERGE, **kwargs)


def pod_doc(name: str, namespace: str, *, node: str | None = None,
            annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
            account: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "e2e-nobody", "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
    if node:
        spec["nodeName"] = node
    if account:
        spec["serviceAccountName"] = account
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": dict(annotations or {}), "labels": dict(labels or {})},
            "spec": spec}




@pytest.fixture(scope="module")
def applied(kube_client: Any) -> Iterator[list[dict[str, Any]]]:
    """The chart's accounts, RBAC and admission policies, applied and in force."""
    objs = render()
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= {
        o["kind"] for o in objs}, "the chart ships no admission policy"
    done = accounts.apply(kube_client, objs)
    try:
        yield objs
    finally:
        accounts.remove(kube_client, done)


@pytest.fixture
def tenant(kube_client: Any, control_plane: ControlPlane,
           applied: list[dict[str, Any]]) -> Iterator[tuple[str, Any]]:
    """A namespace and a client of a tenant that may create, change and delete pods there
    and, for the test, also patch their status and create Bindings. (The built-in ``edit``
    role is aggregated by kube-controller-manager, which does not run here.)"""
    ns = f"tenant-{uuid.uuid4().hex[:6]}"
    ensure_namespace(kube_client, ns)
    for doc in (
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "tenant", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "pods-extra", "namespace": ns},
         "rules": [{"apiGroups": [""], "resources": ["pods"],
                    "verbs": ["get", "list", "create", "update", "patch", "delete"]},
                   {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
                   {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]}]},
        *({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": role, "namespace": ns},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
           "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns}]}
          for kind, role in (("Role", "pods-extra"),)),
    ):
        kube_client.create(codecs.from_dict(doc))
    client = token_client(kube_client, control_plane, "tenant", namespace=ns)
    try:
        yield ns, client
    finally:
        kube_client.delete(Namespace, ns)


def test_tenant_cannot_write_allocations(tenant: tuple[str, Any], kube_client: Any,
                                         control_plane: ControlPlane) -> None:
    """Issue 12 §2: a pod created with a hand-written allocation was served and charged.
    No webhook selects this namespace: the policy alone holds the line."""
    ns, client = tenant
    forged = {"hami.io/vgpu-devices-to-allocate": "GPU-0,NVIDIA,81920,100:;",
              "hami.io/vgpu-node": "node-a", "hami.io/bind-phase": "allocating"}
    message = refused(lambda: client.create(codecs.from_dict(
        pod_doc("forged", ns, annotations=forged))),
        "annotation hami.io/vgpu-devices-to-allocate", "annotation hami.io/bind-phase")
    assert "hami-allocations" in message
    refused(lambda: client.create(codecs.from_dict(
        pod_doc("labelled", ns, labels={"hami.io/vgpu-node": "node-a"}))),
        "label hami.io/vgpu-node")
    # other hami.io/ annotations are the tenant's to set (policies, GPU types)
    client.create(codecs.from_dict(pod_doc(
        "plain", ns, annotations={"hami.io/gpu-scheduler-policy": "binpack"})))
    for key in ("hami.io/vgpu-devices-allocated", "hami.io/Biren-devices-allocated",
                "hami.io/bind-time"):
        refused(lambda k=key: merge(client, Pod, "plain",
                                    {"metadata": {"annotations": {k: "x"}}}, ns),
                f"annotation {key}")
    refused(lambda: merge(client, Pod, "plain",
                          {"metadata": {"labels": {"hami.io/vgpu-node": "node-a"}}}, ns),
            "label hami.io/vgpu-node")
    refused(lambda: client.patch(Pod.Status, "plain",
                                 {"metadata": {"annotations": {"hami.io/vgpu-node": "a"}}},
                                 namespace=ns, patch_type=PatchType.MERGE),
            "annotation hami.io/vgpu-node")
    binding = pod_binding("plain", ns, "node-a")
    binding.metadata.annotations = {"hami.io/vgpu-devices-to-allocate": "GPU-0,NVIDIA,1,1:;"}
    refused(lambda: client.create(binding, name="plain", namespace=ns),
            "annotation hami.io/vgpu-devices-to-allocate")
    # what hami's scheduler's Binding carries to a node in mode cdi, forged
    binding.metadata.annotations = {**forged, "hami.io/vgpu-devices-allocated": "x",
                                    "hami.io/vgpu-time": "1", "hami.io/bind-time": "1",
                                    "hami.io/vgpu-allocation-signature": "v1:0:0"}
    refused(lambda: client.create(binding, name="plain", namespace=ns),
            "annotation hami.io/vgpu-devices-allocated", "annotation hami.io/vgpu-node",
            "annotation hami.io/vgpu-allocation-signature")
    # the API server copies a Binding's labels too (PodTopologyLabelsAdmission, 1.33+)
    binding.metadata.annotations = None
    binding.metadata.labels = {"hami.io/vgpu-node": "node-a"}
    refused(lambda: client.create(binding, name="plain", namespace=ns),
            "label hami.io/vgpu-node")
    assert not kube_client.get(Pod, "plain", namespace=ns).spec.nodeName

    # What hami's scheduler wrote the tenant can neither change nor remove ...
    scheduler = token_client(kube_client, control_plane, SCHEDULER_SA)
    granted = {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,1000,10:;",
               "hami.io/vgpu-node": "node-a"}
    merge(scheduler, Pod, "plain", {"metadata": {"annotations": granted}}, ns)
    refused(lambda: merge(client, Pod, "plain", {"metadata": {"annotations": {
        "hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,1,10:;"}}}, ns),
        "annotation hami.io/vgpu-devices-allocated")
    refused(lambda: merge(client, Pod, "plain", {"metadata": {"annotations": {
        "hami.io/vgpu-devices-allocated": None}}}, ns),
        "annotation hami.io/vgpu-devices-allocated")
    # ... but the rest of its pod stays its own
    merge(client, Pod, "plain", {"metadata": {"annotations": {"team": "a"},
                                              "labels": {"app": "x"}}}, ns)
    live = kube_client.get(Pod, "plain", namespace=ns).metadata.annotations
    assert live["hami.io/vgpu-devices-allocated"] == granted["hami.io/vgpu-devices-allocated"]
    assert live["team"] == "a"


def test_scheduler_account_changes_only_hami_metadata(tenant: tuple[str, Any],
                                                      kube_client: Any,
                                                      control_plane: ControlPlane) -> None:
    """Issue 12 §6: the scheduler's account could patch any pod (a pod's image: code
    execution as any service account) and, bound to system:kube-scheduler, delete pods."""
    ns, _ = tenant
    node = f"rbac-{uuid.uuid4().hex[:6]}"
    create_gpu_node(kube_client, node, gpus=1, labels={"gpu": "on"})
    kube_client.create(codecs.from_dict(pod_doc(
        "victim", ns, annotations={"owner": "tenant"}, labels={"app": "victim"})))
    scheduler = token_client(kube_client, control_plane, SCHEDULER_SA)
    try:
        merge(scheduler, Pod, "victim", {"metadata": {
            "annotations": {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,1000,10:;",
                            "hami.io/bind-phase": "allocating"},
            "labels": {"hami.io/vgpu-node": node}}}, ns)
        user = f"system:serviceaccount:{NAMESPACE}:{SCHEDULER_SA}"
        refused(lambda: scheduler.patch(Pod, "victim", [
            {"op": "replace", "path": "/spec/containers/0/image", "value": "evil:latest"}],
            namespace=ns, patch_type=PatchType.JSON), user, "not their spec")
        refused(lambda: merge(scheduler, Pod, "victim",
                              {"metadata": {"annotations": {"owner": "hami"}}}, ns),
                "annotation owner")
        refused(lambda: merge(scheduler, Pod, "victim",
                              {"metadata": {"labels": {"app": None}}}, ns), "label app")
        refused(lambda: merge(scheduler, Pod, "victim",
                              {"metadata": {"finalizers": ["hami.io/hold"]}}, ns),
                "finalizers")
        refused(lambda: scheduler.delete(Pod, "victim", namespace=ns),
                "cannot delete resource")
        # a Binding's annotations land on the pod: only hami.io/ ones
        binding = pod_binding("victim", ns, node)
        binding.metadata.annotations = {"owner": "hami"}
        refused(lambda: scheduler.create(binding, name="victim", namespace=ns),
                "annotation owner")
        merge(scheduler, Node, node, {"metadata": {"annotations": {
            "hami.io/node-handshake": "Requesting_2025.01.01 00:00:00"}}})
        refused(lambda: merge(scheduler, Node, node, {"spec": {"unschedulable": True}}),
                "not their spec")
        refused(lambda: merge(scheduler, Node, node, {"metadata": {"labels": {"gpu": "off"}}}),
                "label gpu")
        pod = kube_client.get(Pod, "victim", namespace=ns)
        assert pod.spec.containers[0].image == "registry.k8s.io/pause:3.10"
        assert pod.metadata.annotations["owner"] == "tenant"
        assert not kube_client.get(Node, node).spec.unschedulable
        # certgen's Secret rights give no other account's token
        sa_token = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
                    "metadata": {"name": f"steal-{uuid.uuid4().hex[:6]}", "namespace": NAMESPACE,
                                 "annotations": {"kubernetes.io/service-account.name":
                                                 KUBE_SCHEDULER_SA}}}
        refused(lambda: scheduler.create(codecs.from_dict(sa_token)),
                "may write only kubernetes.io/tls Secrets")
        tls = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": f"tls-{uuid.uuid4().hex[:6]}", "namespace": NAMESPACE},
               "data": {"tls.crt": "", "tls.key": ""}}
        scheduler.create(codecs.from_dict(tls))
        kube_client.delete(Secret, tls["metadata"]["name"], namespace=NAMESPACE)
        binding.metadata.annotations = None
        binding.metadata.labels = {"app": "evil"}
        refused(lambda: scheduler.create(binding, name="victim", namespace=ns), "label app")
        # kube-scheduler keeps its own rights (it preempts: deletes pods) on its own account
        kube_sched = token_client(kube_client, control_plane, KUBE_SCHEDULER_SA)
        # the Binding of a bind to a node in mode cdi: the allocation rides on it
        allocation = {"hami.io/vgpu-node": node, "hami.io/vgpu-time": "1",
                      "hami.io/vgpu-devices-to-allocate": "GPU-0,NVIDIA,1000,10:;",
                      "hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,1000,10:;",
                      "hami.io/vgpu-allocation-signature": "v1:0:0",
                      "hami.io/bind-phase": "allocating", "hami.io/bind-time": "1"}
        binding = pod_binding("victim", ns, node)
        binding.metadata.annotations = allocation
        binding.metadata.labels = {"hami.io/vgpu-node": node}
        scheduler.create(binding, name="victim", namespace=ns)
        bound = kube_client.get(Pod, "victim", namespace=ns)
        assert bound.spec.nodeName == node
        assert allocation.items() <= bound.metadata.annotations.items()
        assert bound.metadata.labels["hami.io/vgpu-node"] == node
        kube_sched.delete(Pod, "victim", namespace=ns)
    finally:
        kube_client.delete(Node, node)


def test_device_plugin_account_is_held_to_its_node(tenant: tuple[str, Any], kube_client: Any,
                                                   control_plane: ControlPlane) -> None:
    """Issue 12 §6: the device plugin's account may patch pods of its own node only, and
    only its own node; which node is the apiserver's word (the node of the pod its token is
    bound to), not the plugin's."""
    ns, _ = tenant
    node_a, node_b = (f"rbac-a-{uuid.uuid4().hex[:6]}", f"rbac-b-{uuid.uuid4().hex[:6]}")
    for node in (node_a, node_b):
        create_gpu_node(kube_client, node, gpus=1, labels={"gpu": "on"})
    plugin_pod = kube_client.create(codecs.from_dict(pod_doc(
        f"plugin-{uuid.uuid4().hex[:6]}", NAMESPACE, node=node_a, account=PLUGIN_SA)))
    for name, node in (("on-a", node_a), ("on-b", node_b)):
        kube_client.create(codecs.from_dict(pod_doc(name, ns, node=node)))
    plugin = token_client(kube_client, control_plane, PLUGIN_SA,
                          bound_pod=plugin_pod)
    try:
        phase = {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}}
        merge(plugin, Pod, "on-a", phase, ns)
        refused(lambda: merge(plugin, Pod, "on-b", phase, ns),
                f"on node {node_a} may change only that node and its pods")
        register = {"metadata": {"annotations": {"hami.io/node-nvidia-register": "[]"}}}
        merge(plugin, Node, node_a, register)
        refused(lambda: merge(plugin, Node, node_b, register), "may change only that node")
        refused(lambda: merge(plugin, Node, node_a, {"spec": {"unschedulable": True}}),
                "not their spec")
        refused(lambda: merge(plugin, Pod, "on-a", {"spec": {"activeDeadlineSeconds": 1}}, ns),
                "not their spec")
        # a token that names no node (not bound to a pod on one) is good for nothing
        loose = token_client(kube_client, control_plane, PLUGIN_SA)
        refused(lambda: merge(loose, Pod, "on-a", phase, ns), "needs a token bound")
        assert "hami.io/node-nvidia-register" not in (
            kube_client.get(Node, node_b).metadata.annotations or {})
    finally:
        kube_client.delete(Pod, plugin_pod.metadata.name, namespace=NAMESPACE,
                           grace_period=0)
        for node in (node_a, node_b):
            kube_client.delete(Node, node)
