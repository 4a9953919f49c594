"""What kube-controller-manager would do for an installed chart, done once by the test.

The chart test runs no kube-controller-manager (see docs/install.md, "No
kube-controller-manager"). A chart's pods come from controllers in it,
so the chart test plays those controllers for the objects it installed, once, from the
objects as the API server stores them (nothing is rendered twice):

- :func:`fill_token_secrets`: the token controller fills Secrets of type
  ``kubernetes.io/service-account-token``; here a TokenRequest bound to the Secret;
- :func:`run_deployment`: one pod from a Deployment's pod template (replicas 1; the
  ReplicaSet step is skipped), scheduled by the cluster's scheduler;
- :func:`run_daemonset`: one pod per node from a DaemonSet's pod template, pinned to
  its node by node affinity and given the tolerations the DaemonSet controller adds;
- :func:`publish_endpoints`: the EndpointSlice and the Endpoints of a Service from its
  Ready pods, which the API server uses for webhooks with
  ``--enable-aggregator-routing=true`` (v1.37.2 reads the slice, v1.31.14 the Endpoints).

Pods get an ownerReference to their workload, as the controllers set it, and the
annotation :data:`GENERATION` (the workload's ``metadata.generation`` they were made
from), so that :mod:`hami.testing.chartcontrol` sees which pods a ``helm upgrade`` made
stale.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

__all__ = ["GENERATION", "fill_token_secrets", "publish_endpoints", "run_daemonset",
           "run_deployment"]

#: Pod annotation: the generation of the Deployment or DaemonSet the pod was made from.
GENERATION = "testing.hami.io/workload-generation"

#: Tolerations the DaemonSet controller adds to every daemon pod (pkg/controller/daemon,
#: util.AddOrUpdateDaemonPodTolerations).
DAEMON_TOLERATIONS = [
    {"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": e}
    for k, e in (("not-ready", "NoExecute"), ("unreachable", "NoExecute"),
                 ("disk-pressure", "NoSchedule"), ("memory-pressure", "NoSchedule"),
                 ("pid-pressure", "NoSchedule"), ("unschedulable", "NoSchedule"))
]


def fill_token_secrets(client: Any, namespace: str, ca_pem: bytes,
                       expiration_s: int = 24 * 3600) -> list[str]:
    """Fill every empty ``kubernetes.io/service-account-token`` Secret of ``namespace``
    with ``token`` (a TokenRequest for its ServiceAccount, bound to the Secret),
    ``ca.crt`` and ``namespace``. Returns the names filled."""
    from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Secret, ServiceAccountToken

    filled = []
    for sec in client.list(Secret, namespace=namespace):
        if sec.type != "kubernetes.io/service-account-token" or (sec.data or {}).get("token"):
            continue
        sa = (sec.metadata.annotations or {}).get("kubernetes.io/service-account.name", "")
        req = ServiceAccountToken(metadata=ObjectMeta(), spec=TokenRequestSpec(
            audiences=[], expirationSeconds=expiration_s,
            boundObjectRef=BoundObjectReference(apiVersion="v1", kind="Secret",
                                                name=sec.metadata.name,
                                                uid=sec.metadata.uid)))
        token = client.create(req, sa, namespace=namespace).status.token
        data = {"token": token.encode(), "ca.crt": ca_pem, "namespace": namespace.encode()}
        client.patch(Secret, sec.metadata.name, {"data": {
            k: base64.b64encode(v).decode() for k, v in data.items()}}, namespace=namespace)
        filled.append(sec.metadata.name)
    return filled


def _owner(kind: str, obj: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": obj.metadata.name,
            "uid": obj.metadata.uid, "controller": True, "blockOwnerDeletion": True}


def _pod_from_template(obj: Any, kind: str, name: str) -> dict[str, Any]:
    template = obj.spec.template.to_dict()
    meta = dict(template.get("metadata") or {})
    meta.update(name=name, namespace=obj.metadata.namespace,
                ownerReferences=[_owner(kind, obj)],
                annotations={**(meta.get("annotations") or {}),
                             GENERATION: str(obj.metadata.generation or 0)})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def _suffix(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:5]


def run_deployment(client: Any, namespace: str, name: str) -> str:
    """Create the single pod of Deployment ``name``; returns the pod's name."""
    from lightkube import codecs
    from lightkube.resources.apps_v1 import Deployment

    dep = client.get(Deployment, name, namespace=namespace)
    pod_name = f"{name}-{_suffix(dep.metadata.uid)}"
    client.create(codecs.from_dict(_pod_from_template(dep, "Deployment", pod_name)))
    return pod_name


def run_daemonset(client: Any, namespace: str, name: str) -> list[str]:
    """Create one pod of DaemonSet ``name`` per Node whose labels match its nodeSelector;
    returns the pods' names."""
    from lightkube import codecs
    from lightkube.resources.apps_v1 import DaemonSet
    from lightkube.resources.core_v1 import Node

    ds = client.get(DaemonSet, name, namespace=namespace)
    selector = ds.spec.template.spec.nodeSelector or {}
    names = []
    for node in client.list(Node):
        labels = node.metadata.labels or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            continue
        pod_name = f"{name}-{_suffix(ds.metadata.uid, node.metadata.name)}"
        pod = _pod_from_template(ds, "DaemonSet", pod_name)
        spec = pod["spec"]
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{
                "key": "metadata.name", "operator": "In", "values": [node.metadata.name]}]}]}}}
        spec["tolerations"] = [*(spec.get("tolerations") or []), *DAEMON_TOLERATIONS]
        client.create(codecs.from_dict(pod))
        names.append(pod_name)
    return names


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True"
               for c in ((pod.status.conditions or []) if pod.status else []))


def publish_endpoints(client: Any, namespace: str, service: str) -> int:
    """Create (or replace) the EndpointSlice of Service ``service`` from the Ready pods its
    selector matches, with the Service's ports resolved to container ports; returns the
    number of endpoints."""
    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod, Service
    from lightkube.resources.discovery_v1 import EndpointSlice

    svc = client.get(Service, service, namespace=namespace)
    pods = [p for p in client.list(Pod, namespace=namespace, labels=svc.spec.selector or {})
            if _ready(p) and p.status.podIP]
    ports = []
    for sp in svc.spec.ports or []:
        target = sp.targetPort if sp.targetPort is not None else sp.port
        if isinstance(target, str):
            target = next((cp.containerPort for p in pods for c in p.spec.containers
                           for cp in (c.ports or []) if cp.name == target), None)
        if target is not None:
            ports.append({"name": sp.name or "", "port": int(target),
                          "protocol": sp.protocol or "TCP"})
    slice_name = f"{service}-standin"
    body = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": slice_name, "namespace": namespace,
                     "labels": {"kubernetes.io/service-name": service,
                                "endpointslice.kubernetes.io/managed-by": "hami-test-standin"}},
        "endpoints": [{"addresses": [p.status.podIP], "conditions": {"ready": True},
                       "nodeName": p.spec.nodeName,
                       "targetRef": {"kind": "Pod", "name": p.metadata.name,
                                     "namespace": namespace, "uid": p.metadata.uid}}
                      for p in pods],
        "ports": ports,
    }
    from lightkube import ApiError

    try:
        client.delete(EndpointSlice, slice_name, namespace=namespace)
    except ApiError as err:
        if err.status.code != 404:
            raise
    client.create(codecs.from_dict(body))
    # ... and the Endpoints the endpoints controller writes beside it: kube-apiserver
    # v1.31.14 resolves a webhook Service from Endpoints (v1.37.2 from the slices).
    from lightkube.resources.core_v1 import Endpoints

    endpoints = {
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": service, "namespace": namespace},
        "subsets": [{"addresses": [{"ip": p.status.podIP, "nodeName": p.spec.nodeName,
                                    "targetRef": {"kind": "Pod", "name": p.metadata.name,
                                                  "namespace": namespace,
                                                  "uid": p.metadata.uid}} for p in pods],
                     "ports": ports}] if pods and ports else [],
    }
    try:
        client.delete(Endpoints, service, namespace=namespace)
    except ApiError as err:
        if err.status.code != 404:
            raise
    client.create(codecs.from_dict(endpoints))
    return len(pods)
