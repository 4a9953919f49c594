"""The controllers' part on the chart bed, kept up while ``make cluster NODE=chart`` runs,
so that an operator's own ``helm install``, ``helm upgrade``, ``helm uninstall`` and
``kubectl label node`` take effect as in a cluster (docs/install.md, "Moving from HAMi",
tried by hand on the test node).

The bed runs no kube-controller-manager (:mod:`hami.testing.standins`). :func:`reconcile`
is one pass of what its controllers would do, from the objects the API server holds, in
every namespace:

- root-CA publisher: ``kube-root-ca.crt`` in every namespace (pods' token volumes);
- garbage collector: pods whose Deployment or DaemonSet is gone are deleted;
- Deployment and DaemonSet controllers: pods made from an older generation of their
  workload (a ``helm upgrade`` changed the template; annotation
  :data:`~hami.testing.standins.GENERATION`) are deleted, and so are DaemonSet pods on a
  node the nodeSelector no longer matches; a workload without a pod gets its pods
  (:func:`~hami.testing.standins.run_deployment`, ``run_daemonset``), after its
  namespace's token Secrets are filled. One pod per workload and node: the bed has one
  node, and replacement is delete-then-create (as ``strategy: Recreate``); a pod being
  deleted (``kubectl delete pod``) is replaced once it is gone;
- endpoint-slice controller: a Service whose Ready pods differ from its published
  endpoints is republished (:func:`~hami.testing.standins.publish_endpoints`);
- the workloads' status (``observedGeneration``, replica and scheduled-pod counts), which
  ``kubectl rollout status`` reads.

Nothing is waited for: a pass acts on what it sees and returns; the next pass carries on.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from hami.testing import standins
from hami.testing.nodeapi import ensure_root_ca

__all__ = ["reconcile"]

_KINDS = ("Deployment", "DaemonSet")


def _owner_uid(pod: Any) -> str | None:
    for ref in pod.metadata.ownerReferences or []:
        if ref.kind in _KINDS:
            return str(ref.uid)
    return None


def _delete(client: Any, pod: Any) -> None:
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Pod

    try:
        client.delete(Pod, pod.metadata.name, namespace=pod.metadata.namespace,
                      grace_period=0)
    except ApiError as err:
        if err.status.code != 404:
            raise


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True"
               for c in ((pod.status.conditions or []) if pod.status else []))


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _published(client: Any, namespace: str, service: str) -> set[str]:
    from lightkube import ApiError
    from lightkube.resources.discovery_v1 import EndpointSlice

    try:
        es = client.get(EndpointSlice, f"{service}-standin", namespace=namespace)
    except ApiError as err:
        if err.status.code == 404:
            return set()
        raise
    return {a for e in es.endpoints or [] for a in e.addresses}


def _sync_endpoints(client: Any, namespaces: set[str]) -> list[str]:
    from lightkube.resources.core_v1 import Pod, Service

    done = []
    for ns in sorted(namespaces):
        pods = list(client.list(Pod, namespace=ns))  # after this pass's deletions
        for svc in client.list(Service, namespace=ns):
            selector = dict(svc.spec.selector or {}) if svc.spec else {}
            if not selector:
                continue
            ready = {p.status.podIP for p in pods
                     if not p.metadata.deletionTimestamp and _ready(p) and p.status.podIP
                     and _matches(selector, dict(p.metadata.labels or {}))}
            if ready != _published(client, ns, svc.metadata.name):
                standins.publish_endpoints(client, ns, svc.metadata.name)
                done.append(f"endpoints {ns}/{svc.metadata.name}: {len(ready)}")
    return done


def _status(kind: str, w: Any, pods: list[Any], desired: int) -> dict[str, Any]:
    gen = str(w.metadata.generation or 0)
    mine = [p for p in pods if _owner_uid(p) == str(w.metadata.uid)
            and not p.metadata.deletionTimestamp]
    updated = sum(1 for p in mine
                  if (p.metadata.annotations or {}).get(standins.GENERATION) == gen)
    ready = sum(1 for p in mine if _ready(p))
    if kind == "Deployment":
        return {"observedGeneration": w.metadata.generation, "replicas": len(mine),
                "updatedReplicas": updated, "readyReplicas": ready,
                "availableReplicas": ready, "unavailableReplicas": max(0, len(mine) - ready)}
    return {"observedGeneration": w.metadata.generation, "desiredNumberScheduled": desired,
            "currentNumberScheduled": len(mine), "numberMisscheduled": 0,
            "updatedNumberScheduled": updated, "numberReady": ready,
            "numberAvailable": ready, "numberUnavailable": max(0, desired - ready)}


def _sync_status(client: Any, workloads: dict[str, tuple[str, Any]],
                 nodes: dict[str, dict[str, str]]) -> None:
    from lightkube.resources.apps_v1 import DaemonSet, Deployment
    from lightkube.resources.core_v1 import Pod

    by_ns: dict[str, list[Any]] = {}
    for kind, w in workloads.values():
        ns = w.metadata.namespace
        if ns not in by_ns:
            by_ns[ns] = list(client.list(Pod, namespace=ns))
        selector = dict(w.spec.template.spec.nodeSelector or {})
        desired = (1 if kind == "Deployment"
                   else sum(1 for labels in nodes.values() if _matches(selector, labels)))
        want = _status(kind, w, by_ns[ns], desired)
        have = w.status.to_dict() if w.status else {}
        if any(have.get(k, 0) != v for k, v in want.items()):
            res = Deployment.Status if kind == "Deployment" else DaemonSet.Status
            client.patch(res, w.metadata.name, {"status": want}, namespace=ns)


def reconcile(client: Any, ca_file: Path, namespaces: Collection[str] | None = None
              ) -> list[str]:
    """One pass of the controllers' part (module docstring) over the cluster ``client``
    (cluster-admin) reaches; ``ca_file`` is the cluster CA (PEM) for ``kube-root-ca.crt``
    and the token Secrets. ``namespaces`` limits the pass to those (default: all).

    Returns:
        What was done, one line each (``"deleted ns/pod: why"``, ``"created ns/pod"``,
        ``"endpoints ns/svc: n"``); empty when everything was in place.

    Raises:
        lightkube.ApiError: the API refused a read or write (a pod creation the
            admission refused, e.g.); the next pass tries again.
    """
    from lightkube.resources.apps_v1 import DaemonSet, Deployment
    from lightkube.resources.core_v1 import Namespace, Node, Pod

    done: list[str] = []

    def wanted(ns: str) -> bool:
        return namespaces is None or ns in namespaces

    for ns in client.list(Namespace):
        if wanted(ns.metadata.name) and not (ns.status and ns.status.phase == "Terminating"):
            ensure_root_ca(client, ns.metadata.name, ca_file)
    workloads: dict[str, tuple[str, Any]] = {}
    for kind, res in (("Deployment", Deployment), ("DaemonSet", DaemonSet)):
        for w in client.list(res, namespace="*"):
            if wanted(w.metadata.namespace):
                workloads[str(w.metadata.uid)] = (kind, w)
    nodes = {n.metadata.name: dict(n.metadata.labels or {}) for n in client.list(Node)}
    pods = [p for p in client.list(Pod, namespace="*") if wanted(p.metadata.namespace)]
    owned: dict[str, list[Any]] = {}
    for pod in pods:
        uid = _owner_uid(pod)
        if uid is None:
            continue
        if pod.metadata.deletionTimestamp:  # going: its successor waits (same name)
            owned.setdefault(uid, []).append(pod)
            continue
        where = f"{pod.metadata.namespace}/{pod.metadata.name}"
        if uid not in workloads:
            _delete(client, pod)
            done.append(f"deleted {where}: its workload is gone")
            continue
        kind, w = workloads[uid]
        made_from = (pod.metadata.annotations or {}).get(standins.GENERATION)
        selector = dict(w.spec.template.spec.nodeSelector or {})
        if made_from != str(w.metadata.generation or 0):
            _delete(client, pod)
            done.append(f"deleted {where}: {kind} {w.metadata.name} changed")
        elif kind == "DaemonSet" and pod.spec.nodeName \
                and not _matches(selector, nodes.get(pod.spec.nodeName, {})):
            _delete(client, pod)
            done.append(f"deleted {where}: node {pod.spec.nodeName} no longer matches")
        else:
            owned.setdefault(uid, []).append(pod)
    ca_pem = ca_file.read_bytes()
    for uid, (kind, w) in workloads.items():
        if owned.get(uid):
            continue
        ns, name = w.metadata.namespace, w.metadata.name
        standins.fill_token_secrets(client, ns, ca_pem)
        made = ([standins.run_deployment(client, ns, name)] if kind == "Deployment"
                else standins.run_daemonset(client, ns, name))
        done += [f"created {ns}/{p}" for p in made]
    done += _sync_endpoints(client, {w.metadata.namespace for _, w in workloads.values()})
    _sync_status(client, workloads, nodes)
    return done
