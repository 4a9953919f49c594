"""The real control plane works, and kube-scheduler drives an extender as HAMi's does."""

from __future__ import annotations

import base64
import json
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube.models.admissionregistration_v1 import (
    MutatingWebhook,
    RuleWithOperations,
    WebhookClientConfig,
)
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.core_v1 import Namespace, Node, Pod

from hami.core.clusterfacts import BINDING_LABELS_MINOR
from hami.testing.controlplane import (
    KUBERNETES_VERSION,
    ControlPlane,
    bind_pod,
    create_gpu_node,
    node_is_ready,
    set_node_status,
    set_pod_phase,
    wait_until,
)

from .recording_extender import WEBHOOK_ANNOTATION, RecordingExtender

pytestmark = pytest.mark.e2e

NODE = "gpu-node-1"
# What a HAMi device plugin writes: the device list (spec §2.3) and the handshake (§2.1).
REGISTER = json.dumps(
    [
        {
            "id": f"GPU-{i:08d}-0000-0000-0000-000000000000",
            "index": i,
            "count": 10,
            "devmem": 81920,
            "devcore": 100,
            "type": "NVIDIA-H100",
            "mode": "hami-core",
            "health": True,
        }
        for i in range(4)
    ],
    separators=(",", ":"),
)
ANNOTATIONS = {
    "hami.io/node-nvidia-register": REGISTER,
    "hami.io/node-handshake": "Requesting_2026-01-01 00:00:00",
}


@pytest.fixture(scope="module")
def gpu_node(kube_client: Any) -> Iterator[str]:
    """The one schedulable node of this module: 4 GPUs x 10 splits = nvidia.com/gpu 40."""
    create_gpu_node(kube_client, NODE, gpus=40, annotations=ANNOTATIONS)
    yield NODE
    kube_client.delete(Node, NODE)


def make_pod(scheduler_name: str, gpus: int = 0) -> Pod:
    """A pause pod with a unique name; ``gpus`` > 0 adds an nvidia.com/gpu limit."""
    resources = ResourceRequirements(
        requests={"cpu": "10m"},
        limits={"nvidia.com/gpu": str(gpus)} if gpus else None,
    )
    return Pod(
        metadata=ObjectMeta(name=f"p-{uuid.uuid4().hex[:8]}", namespace="default"),
        spec=PodSpec(
            schedulerName=scheduler_name,
            containers=[
                Container(name="main", image="registry.k8s.io/pause:3.10", resources=resources)
            ],
        ),
    )


def wait_bound(client: Any, name: str, timeout_s: float = 60.0) -> str:
    """Wait until pod ``name`` (namespace default) has ``spec.nodeName``; return it."""
    bound: dict[str, str] = {}

    def check() -> bool:
        pod = client.get(Pod, name, namespace="default")
        if pod.spec.nodeName:
            bound["node"] = pod.spec.nodeName
        return bool(bound)

    wait_until(check, timeout_s=timeout_s, what=f"pod {name} to be bound")
    return bound["node"]


def test_apiserver_answers_with_pinned_version(control_plane: ControlPlane, kube_client: Any):
    with urllib.request.urlopen(
        f"{control_plane.server}/version", context=control_plane.ssl_context(), timeout=10
    ) as resp:
        version = json.load(resp)
    assert version["gitVersion"] == KUBERNETES_VERSION
    assert kube_client.get(Namespace, "default").metadata.name == "default"


def test_gpu_node_is_registered_and_ready(kube_client: Any, gpu_node: str):
    node = kube_client.get(Node, gpu_node)
    assert node.status.allocatable["nvidia.com/gpu"] == "40"
    assert node.status.capacity["nvidia.com/gpu"] == "40"
    assert node.metadata.annotations["hami.io/node-nvidia-register"] == REGISTER
    assert node_is_ready(node)
    # No kube-controller-manager runs, so nothing adds not-ready/unreachable taints.
    assert not node.spec.taints


class _HandshakeRace:
    """A lightkube client whose Node status patches are each followed, before their
    reply is handed back, by another writer's annotation patch: what hami's scheduler
    does when it sees a new node (its handshake) between the harness's status patch
    and its taint patch."""

    def __init__(self, client: Any, writes: int) -> None:
        self._client, self.writes = client, writes

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._client, attr)

    def patch(self, res: Any, name: str, obj: Any, **kwargs: Any) -> Any:
        from lightkube.types import PatchType

        reply = self._client.patch(res, name, obj, **kwargs)
        if res is Node.Status and self.writes:
            self.writes -= 1
            self._client.patch(Node, name, {"metadata": {"annotations": {
                "hami.io/node-handshake": "Requesting_2026-01-01 00:00:00"}}},
                patch_type=PatchType.MERGE)
        return reply


def test_a_node_made_ready_while_another_writer_annotates_it(kube_client: Any):
    """The taint patch carries the resourceVersion of the status patch's reply; a write
    in between gets it a 409, and the harness computes the taints again from a fresh
    read (CI once failed on this 409 while hami's scheduler wrote its handshake)."""
    name = f"race-{uuid.uuid4().hex[:6]}"
    racing = _HandshakeRace(kube_client, writes=1)
    try:
        create_gpu_node(racing, name, gpus=1)
        node = kube_client.get(Node, name)
        assert racing.writes == 0  # the other writer did come in between
        assert node_is_ready(node) and not node.spec.taints
        assert node.metadata.annotations["hami.io/node-handshake"].startswith("Requesting_")
        # made not ready again under the same race: the taint is back, the status False
        racing.writes = 1
        set_node_status(racing, name, ready=False)
        node = kube_client.get(Node, name)
        assert racing.writes == 0
        assert not node_is_ready(node)
        assert [t.key for t in node.spec.taints or []] == ["node.kubernetes.io/not-ready"]
    finally:
        kube_client.delete(Node, name)


def test_default_scheduler_binds_plain_pod(kube_client: Any, gpu_node: str):
    pod = kube_client.create(make_pod("default-scheduler"))
    try:
        assert wait_bound(kube_client, pod.metadata.name) == gpu_node
    finally:
        kube_client.delete(Pod, pod.metadata.name, namespace="default", grace_period=0)


def test_bind_pod_and_set_pod_phase_act_like_scheduler_and_kubelet(kube_client: Any, gpu_node: str):
    pod = kube_client.create(make_pod("no-such-scheduler"))  # nobody else binds it
    name = pod.metadata.name
    try:
        bind_pod(kube_client, name, "default", gpu_node)
        assert kube_client.get(Pod, name, namespace="default").spec.nodeName == gpu_node
        set_pod_phase(kube_client, name, "default", "Running")
        set_pod_phase(kube_client, name, "default", "Succeeded")
        assert kube_client.get(Pod, name, namespace="default").status.phase == "Succeeded"
    finally:
        kube_client.delete(Pod, name, namespace="default", grace_period=0)


def test_a_bindings_annotations_land_on_the_pod_in_the_write_that_binds_it(
    kube_client: Any, gpu_node: str
):
    """What hami's ``/bind`` to a node in allocate mode ``cdi`` relies on: the API server
    copies a Binding's ``metadata.annotations`` onto the pod in the same write that sets
    ``spec.nodeName`` (one new resourceVersion, one watch event), keeping the pod's
    other annotations. Its labels too on newer servers (v1.35.4 and v1.37.2; v1.31.14 and
    v1.33.13 drop them, hami.core.clusterfacts)."""
    from hami.testing.controlplane import pod_binding

    pod = make_pod("no-such-scheduler")
    pod.metadata.annotations = {"tenant": "kept", "hami.io/bind-phase": "old"}
    created = kube_client.create(pod)
    name = created.metadata.name
    try:
        binding = pod_binding(name, "default", gpu_node)
        binding.metadata.uid = created.metadata.uid
        binding.metadata.annotations = {"hami.io/vgpu-node": gpu_node,
                                        "hami.io/bind-phase": "allocating"}
        binding.metadata.labels = {"hami.io/vgpu-node": gpu_node}
        kube_client.create(binding, name=name, namespace="default")
        now = kube_client.get(Pod, name, namespace="default").metadata.resourceVersion
        # The first change after the create is the bound pod, and it is the pod as it is now.
        kind, bound = next(iter(kube_client.watch(
            Pod, namespace="default", fields={"metadata.name": name},
            resource_version=created.metadata.resourceVersion)))
        assert (kind, bound.metadata.resourceVersion) == ("MODIFIED", now)
        assert bound.spec.nodeName == gpu_node
        assert bound.metadata.annotations == {"tenant": "kept",
                                              "hami.io/vgpu-node": gpu_node,
                                              "hami.io/bind-phase": "allocating"}
        copied = (bound.metadata.labels or {}).get("hami.io/vgpu-node") == gpu_node
        # dropped by older servers: hami's scheduler then patches the label after the Binding
        assert copied is (int(KUBERNETES_VERSION.split(".")[1]) >= BINDING_LABELS_MINOR)
    finally:
        kube_client.delete(Pod, name, namespace="default", grace_period=0)


@pytest.fixture
def extender(control_plane: ControlPlane, start_kube_scheduler: Any) -> Iterator[RecordingExtender]:
    """A RecordingExtender registered (HAMi chart settings) with a ``hami-scheduler``."""
    ext = RecordingExtender(control_plane.kubeconfig).start()
    try:
        start_kube_scheduler(ext.url, scheduler_name="hami-scheduler")
        yield ext
    finally:
        ext.stop()


# 100 > the node's 40: kube-scheduler leaves managed resources to the extender
# (ignoredByScheduler), so only the extender decides.
@pytest.mark.parametrize("gpus", [1, 100])
def test_kube_scheduler_calls_extender_filter_and_bind(
    kube_client: Any, gpu_node: str, extender: RecordingExtender, gpus: int
):
    pod = kube_client.create(make_pod("hami-scheduler", gpus=gpus))
    name = pod.metadata.name
    try:
        assert wait_bound(kube_client, name) == gpu_node
    finally:
        kube_client.delete(Pod, name, namespace="default", grace_period=0)

    assert extender.verbs() == ["filter", "bind"]
    assert [c.error for c in extender.calls] == ["", ""]
    filter_args = extender.calls[0].body
    assert set(filter_args) == {"Pod", "Nodes", "NodeNames"}
    assert filter_args["NodeNames"] == [gpu_node]  # nodeCacheCapable: names only
    assert filter_args["Nodes"] is None
    assert filter_args["Pod"]["metadata"]["name"] == name
    assert filter_args["Pod"]["spec"]["schedulerName"] == "hami-scheduler"
    limits = filter_args["Pod"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": str(gpus)}
    bind_args = extender.calls[1].body
    assert bind_args == {
        "PodName": name,
        "PodNamespace": "default",
        "PodUID": pod.metadata.uid,
        "Node": gpu_node,
    }


def test_extender_rejection_leaves_pod_pending(
    kube_client: Any, gpu_node: str, extender: RecordingExtender
):
    extender.reject[gpu_node] = "CardInsufficientMemory"
    pod = kube_client.create(make_pod("hami-scheduler", gpus=1))
    name = pod.metadata.name
    seen: dict[str, Any] = {}

    def unschedulable() -> bool:
        status = kube_client.get(Pod, name, namespace="default").status
        for cond in (status.conditions if status else None) or []:
            if cond.type == "PodScheduled" and cond.reason == "Unschedulable":
                seen["message"] = cond.message
                return True
        return False

    try:
        wait_until(unschedulable, timeout_s=60, what=f"pod {name} to be Unschedulable")
        assert kube_client.get(Pod, name, namespace="default").spec.nodeName is None
    finally:
        kube_client.delete(Pod, name, namespace="default", grace_period=0)
    assert "CardInsufficientMemory" in seen["message"]
    assert "bind" not in extender.verbs()


def test_a_pod_whose_rejection_ends_without_an_event_is_retried(
    kube_client: Any, gpu_node: str, extender: RecordingExtender
):
    """kube-scheduler retries an unschedulable pod on a cluster event that maps to it, or
    when it has been in the unschedulable pool longer than
    ``--pod-max-in-unschedulable-pods-duration``. Here the extender changes its mind and
    nothing in the cluster changes (so no event): the test control plane's scheduler
    retries within ``UNSCHEDULABLE_RETRY_S`` + its queue's 30 s period, not kube-scheduler's
    5 minutes. DRA pods meet such a change (a double count in v1.37's DynamicResources
    that ends without an event); the tests' waits count on this retry."""
    from hami.testing.clusterconfig import UNSCHEDULABLE_RETRY_S

    extender.reject[gpu_node] = "CardInsufficientMemory"
    pod = kube_client.create(make_pod("hami-scheduler", gpus=1))
    name = pod.metadata.name

    def unschedulable() -> bool:
        status = kube_client.get(Pod, name, namespace="default").status
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable"
                   for c in (status.conditions if status else None) or [])

    try:
        wait_until(unschedulable, timeout_s=60, what=f"pod {name} to be Unschedulable")
        extender.reject.clear()
        assert wait_bound(kube_client, name, timeout_s=UNSCHEDULABLE_RETRY_S + 30 + 25) == gpu_node
    finally:
        kube_client.delete(Pod, name, namespace="default", grace_period=0)
    assert extender.verbs()[-2:] == ["filter", "bind"]


def test_port_taken_between_pick_and_bind_is_retried(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
):
    from hami.testing import controlplane

    with socket.socket() as squatter:
        squatter.bind((controlplane.HOST, 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        picks = iter([taken])
        real_free_port = controlplane.free_port
        monkeypatch.setattr(
            controlplane, "free_port", lambda: next(picks, None) or real_free_port()
        )
        handle = control_plane.start_scheduler(scheduler_name="port-clash-test")
    try:
        assert handle.port != taken
        handle.component.check_alive()
    finally:
        handle.stop()


def test_a_second_scheduler_with_the_same_profile_is_refused(control_plane: ControlPlane):
    with pytest.raises(ValueError, match="default-scheduler"):
        control_plane.start_scheduler(scheduler_name="default-scheduler")


def test_apiserver_calls_a_mutating_webhook_on_loopback(
    control_plane: ControlPlane, kube_client: Any, gpu_node: str
):
    """What hami's /webhook needs: the apiserver reaches an HTTPS webhook on 127.0.0.1."""
    hook = RecordingExtender(control_plane.kubeconfig).start()
    name = f"hami-e2e-{uuid.uuid4().hex[:8]}"
    config = MutatingWebhookConfiguration(
        metadata=ObjectMeta(name=name),
        webhooks=[
            MutatingWebhook(
                name="e2e.hami.io",
                admissionReviewVersions=["v1"],
                sideEffects="None",
                failurePolicy="Fail",
                timeoutSeconds=10,
                clientConfig=WebhookClientConfig(
                    url=f"{hook.url}/webhook",
                    caBundle=base64.b64encode(hook.ca_pem).decode(),
                ),
                rules=[
                    RuleWithOperations(
                        apiGroups=[""],
                        apiVersions=["v1"],
                        operations=["CREATE"],
                        resources=["pods"],
                    )
                ],
                objectSelector=LabelSelector(matchLabels={"e2e.hami.io/webhook": name}),
            )
        ],
    )
    kube_client.create(config)
    pod = make_pod("no-such-scheduler")
    pod.metadata.labels = {"e2e.hami.io/webhook": name}
    try:
        created = kube_client.create(pod)
        kube_client.delete(Pod, created.metadata.name, namespace="default", grace_period=0)
    finally:
        kube_client.delete(MutatingWebhookConfiguration, name)
        hook.stop()
    assert created.metadata.annotations[WEBHOOK_ANNOTATION] == "true"
    assert hook.verbs() == ["webhook"]
    review = hook.calls[0].body
    assert review["kind"] == "AdmissionReview"
    assert review["request"]["operation"] == "CREATE"
    assert review["request"]["object"]["spec"]["schedulerName"] == "no-such-scheduler"
