"""The chart bed's controllers' part (:mod:`hami.testing.chartcontrol`) against the real
API server and kube-scheduler: what an operator's ``helm install``/``upgrade``/
``uninstall`` and ``kubectl label node`` on ``make cluster NODE=chart`` rely on (the
migration walkthrough of docs/install.md, issue 28). No kubelet: pod readiness is written
through the status subresource, as a kubelet would."""

from __future__ import annotations

from typing import Any

import pytest

from hami.testing import standins
from hami.testing.chartcontrol import reconcile
from hami.testing.controlplane import ControlPlane, wait_until
from hami.testing.kubeobjects import create_gpu_node, ensure_namespace

pytestmark = pytest.mark.e2e

NS = "chartcontrol"
NODE = "chartcontrol-0"
LABEL = "chartcontrol.test/gpu"


def _template(app: str, selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"serviceAccountName": app,
                            "containers": [{"name": "c", "image": "example.invalid/c:1",
                                            "ports": [{"name": "https",
                                                       "containerPort": 9443}]}]}
    if selector:
        spec["nodeSelector"] = selector
    return {"metadata": {"labels": {"app": app}}, "spec": spec}


def _pods(client: Any, app: str) -> list[Any]:
    from lightkube.resources.core_v1 import Pod

    return list(client.list(Pod, namespace=NS, labels={"app": app}))


def _bound(client: Any, app: str) -> Any:
    def one() -> bool:
        return any(p.spec.nodeName for p in _pods(client, app))

    wait_until(one, timeout_s=30, what=f"the {app} pod bound")
    [pod] = _pods(client, app)
    return pod


def _mark_ready(client: Any, pod: Any, ip: str) -> None:
    from lightkube.resources.core_v1 import Pod

    client.patch(Pod.Status, pod.metadata.name, {"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}]}}, namespace=NS)


def _objects(client: Any) -> None:
    from lightkube import codecs

    for name in ("sched", "plugin"):
        client.create(codecs.from_dict({"apiVersion": "v1", "kind": "ServiceAccount",
                                        "metadata": {"name": name, "namespace": NS}}))
    client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "sched-token", "namespace": NS,
                     "annotations": {"kubernetes.io/service-account.name": "sched"}}}))
    client.create(codecs.from_dict({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "sched", "namespace": NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "sched"}},
                 "template": _template("sched")}}))
    client.create(codecs.from_dict({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "plugin", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "plugin"}},
                 "template": _template("plugin", {LABEL: "on"})}}))
    client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "sched", "namespace": NS},
        "spec": {"selector": {"app": "sched"},
                 "ports": [{"name": "https", "port": 443, "targetPort": "https"}]}}))


def test_reconcile_plays_the_controllers(control_plane: ControlPlane, kube_client: Any) -> None:
    from lightkube.resources.apps_v1 import DaemonSet, Deployment
    from lightkube.resources.core_v1 import ConfigMap, Node, Pod, Secret
    from lightkube.resources.discovery_v1 import EndpointSlice

    client, ca = kube_client, control_plane.ca_file
    create_gpu_node(client, NODE, gpus=1, labels={LABEL: "on"})
    ensure_namespace(client, NS)
    _objects(client)

    def run() -> list[str]:
        return reconcile(client, ca, namespaces=[NS])

    # a fresh install: one pod per workload, the token and root CA in place
    done = run()
    assert sorted(line.split("/")[1].rsplit("-", 1)[0] for line in done) == \
        ["plugin", "sched"], done
    assert client.get(ConfigMap, "kube-root-ca.crt", namespace=NS).data["ca.crt"]
    assert client.get(Secret, "sched-token", namespace=NS).data["token"]
    assert run() == []  # nothing more to do
    sched = _bound(client, "sched")
    assert sched.metadata.annotations[standins.GENERATION] == "1"
    assert _bound(client, "plugin").spec.nodeName == NODE

    # the scheduler pod Ready: its Service gets the endpoint, once
    _mark_ready(client, sched, "10.88.0.7")
    assert run() == [f"endpoints {NS}/sched: 1"]
    slice_ = client.get(EndpointSlice, "sched-standin", namespace=NS)
    assert [e.addresses for e in slice_.endpoints] == [["10.88.0.7"]]
    assert [p.port for p in slice_.ports] == [9443]
    assert run() == []

    # kubectl rollout status reads what the controllers write
    dep = client.get(Deployment, "sched", namespace=NS)
    assert (dep.status.observedGeneration, dep.status.updatedReplicas,
            dep.status.availableReplicas) == (1, 1, 1)
    ds = client.get(DaemonSet, "plugin", namespace=NS)
    assert (ds.status.desiredNumberScheduled, ds.status.updatedNumberScheduled,
            ds.status.numberAvailable or 0) == (1, 1, 0)  # the API leaves 0 out

    # helm upgrade changed the template: the pod is replaced from the new generation
    client.patch(Deployment, "sched", {"spec": {"template": {"metadata": {
        "annotations": {"checksum/config": "2"}}}}}, namespace=NS)
    done = run()
    assert done[0] == f"deleted {NS}/{sched.metadata.name}: Deployment sched changed", done
    assert f"created {NS}/{sched.metadata.name}" in done
    assert f"endpoints {NS}/sched: 0" in done
    new = _bound(client, "sched")
    assert new.metadata.uid != sched.metadata.uid
    assert new.metadata.annotations[standins.GENERATION] == "2"
    assert new.metadata.annotations["checksum/config"] == "2"

    # a pod being deleted is replaced only once it is gone (its successor has its name)
    plugin = _bound(client, "plugin")
    client.delete(Pod, plugin.metadata.name, namespace=NS, grace_period=30)
    assert client.get(Pod, plugin.metadata.name, namespace=NS).metadata.deletionTimestamp
    assert run() == []
    client.delete(Pod, plugin.metadata.name, namespace=NS, grace_period=0)
    assert run() == [f"created {NS}/{plugin.metadata.name}"]

    # the node relabelled away from the DaemonSet: its pod goes, none comes; back again
    client.patch(Node, NODE, {"metadata": {"labels": {LABEL: "hami"}}})
    assert run() == [f"deleted {NS}/{plugin.metadata.name}: node {NODE} no longer matches"]
    assert _pods(client, "plugin") == []
    assert run() == []
    client.patch(Node, NODE, {"metadata": {"labels": {LABEL: "on"}}})
    assert run() == [f"created {NS}/{plugin.metadata.name}"]

    # helm uninstall removed the Deployment: the garbage collector's part
    client.delete(Deployment, "sched", namespace=NS)
    assert run() == [f"deleted {NS}/{new.metadata.name}: its workload is gone"]
    assert _pods(client, "sched") == []
    client.delete(Node, NODE)
