"""Helm operations on a started :class:`~hami.testing.chartbed.ChartBed`, with the
controllers' part played after each (the bed runs no kube-controller-manager, see
:mod:`hami.testing.standins`): what an operator does to a live cluster, for the migration
tests (docs/install.md, "Moving from HAMi").

- :func:`prepare_namespace`: a namespace with its ``kube-root-ca.crt`` ConfigMap;
- :func:`install`: ``helm install`` of a further release, then its token Secrets, the pod of
  each of its Deployments, one pod per matching node of each DaemonSet, the scheduler
  Service's EndpointSlice;
- :func:`uninstall`: ``helm uninstall``, then what the garbage collector does: the pods
  whose Deployment or DaemonSet is gone are deleted;
- :func:`upgrade`: ``helm upgrade --reuse-values``, then the workloads' pods are replaced
  (as a rolling update would);
- :func:`sync_daemonsets`: what the DaemonSet controller does after a node's labels change:
  pods on nodes the selector no longer matches are deleted, missing ones created.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from typing import Any

import yaml

from hami.testing import standins
from hami.testing.chartbed import CHART, ChartBed, _merge, chart_test_values, helm_binary
from hami.testing.controlplane import ControlPlaneError, ensure_namespace, wait_until
from hami.testing.node import ensure_root_ca

__all__ = ["helm", "install", "prepare_namespace", "sync_daemonsets", "uninstall", "upgrade"]


def helm(bed: ChartBed, *args: str, values: Mapping[str, Any] | None = None) -> str:
    """Run ``helm ARGS --kubeconfig <the bed's>`` (with ``-f`` of ``values`` merged over
    the test node's :func:`~hami.testing.chartbed.chart_test_values`); returns stdout.

    Raises:
        ControlPlaneError: helm failed (its output in the message).
    """
    assert bed.cp is not None, "start the bed first"
    argv = [helm_binary(), *args, "--kubeconfig", str(bed.cp.kubeconfig)]
    if values is not None:
        path = bed.workdir / f"values-{len(list(bed.workdir.glob('values-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(_merge(chart_test_values(bed.workdir / "inventory.yaml"),
                                              values)))
        argv += ["-f", str(path)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=180, env={
        "HOME": str(bed.workdir), "PATH": "/usr/bin:/bin",
        "HELM_CACHE_HOME": str(bed.workdir / "helm/cache"),
        "HELM_CONFIG_HOME": str(bed.workdir / "helm/config"),
        "HELM_DATA_HOME": str(bed.workdir / "helm/data")})
    if p.returncode != 0:
        raise ControlPlaneError(f"helm {args[0]} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return p.stdout


def _start_workloads(bed: ChartBed, namespace: str, release: str) -> dict[str, list[str]]:
    """Token Secrets, then pods for every Deployment and DaemonSet of ``release`` in
    ``namespace`` that has none yet; waits until they are Ready and publishes the
    scheduler Service's endpoints. Returns workload name -> pod names."""
    from lightkube.resources.apps_v1 import DaemonSet, Deployment
    from lightkube.resources.core_v1 import Pod

    assert bed.cp is not None
    client = bed.client()
    started: dict[str, list[str]] = {}
    try:
        standins.fill_token_secrets(client, namespace, bed.cp.ca_file.read_bytes())
        owned = {ref.name for p in client.list(Pod, namespace=namespace)
                 for ref in (p.metadata.ownerReferences or [])}
        selector = {"app.kubernetes.io/instance": release}
        for dep in client.list(Deployment, namespace=namespace, labels=selector):
            if dep.metadata.name not in owned:
                started[dep.metadata.name] = [standins.run_deployment(
                    client, namespace, dep.metadata.name)]
        for ds in client.list(DaemonSet, namespace=namespace, labels=selector):
            if ds.metadata.name not in owned:
                started[ds.metadata.name] = standins.run_daemonset(
                    client, namespace, ds.metadata.name)
        for pods in started.values():
            for pod in pods:
                bed.wait_pod_ready(pod, namespace=namespace, timeout_s=180)
        service = f"{release}-scheduler"
        if any(name == service for name in started) and \
                standins.publish_endpoints(client, namespace, service) < 1:
            raise ControlPlaneError(f"Service {service} has no Ready pod")
    finally:
        client.close()
    return started


def prepare_namespace(bed: ChartBed, namespace: str) -> None:
    """Create ``namespace`` on the started ``bed`` if missing, with its
    ``kube-root-ca.crt`` ConfigMap (what kube-controller-manager would publish there).

    Raises:
        lightkube.ApiError: the API refused a write.
    """
    assert bed.cp is not None, "start the bed first"
    client = bed.client()
    try:
        ensure_namespace(client, namespace)
        ensure_root_ca(client, namespace, bed.cp.ca_file)
    finally:
        client.close()


def install(bed: ChartBed, release: str, namespace: str,
            values: Mapping[str, Any]) -> dict[str, list[str]]:
    """``helm install release deploy/helm/hami -n namespace`` with ``values`` over the
    test node's, then the controllers' part; returns workload name -> pod names.

    Raises:
        ControlPlaneError: helm refused (e.g. an object of another release has the same
            name), or a pod did not become Ready.
    """
    prepare_namespace(bed, namespace)
    helm(bed, "install", release, str(CHART), "--namespace", namespace, values=values)
    return _start_workloads(bed, namespace, release)


def _delete_pods(client: Any, namespace: str, names: list[str], timeout_s: float) -> None:
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Pod

    for name in names:
        try:
            client.delete(Pod, name, namespace=namespace, grace_period=0)
        except ApiError as err:
            if err.status.code != 404:
                raise
    left = set(names)

    def gone() -> bool:
        left.intersection_update(p.metadata.name for p in client.list(Pod, namespace=namespace))
        return not left

    wait_until(gone, timeout_s=timeout_s, what=f"pods {sorted(left)} deleted")


def uninstall(bed: ChartBed, release: str, namespace: str, timeout_s: float = 90.0) -> None:
    """``helm uninstall``, then the garbage collector's part: the release's pods whose
    owner (Deployment or DaemonSet) is gone are deleted, and waited for."""
    from lightkube.resources.apps_v1 import DaemonSet, Deployment
    from lightkube.resources.core_v1 import Pod

    helm(bed, "uninstall", release, "--namespace", namespace, "--wait")
    client = bed.client()
    try:
        live = {d.metadata.uid for kind in (Deployment, DaemonSet)
                for d in client.list(kind, namespace=namespace)}
        orphans = [p.metadata.name for p in client.list(Pod, namespace=namespace)
                   if any(ref.kind in ("Deployment", "DaemonSet") and ref.uid not in live
                          for ref in (p.metadata.ownerReferences or []))]
        _delete_pods(client, namespace, orphans, timeout_s)
    finally:
        client.close()


def upgrade(bed: ChartBed, release: str, namespace: str, values: Mapping[str, Any],
            timeout_s: float = 90.0) -> dict[str, list[str]]:
    """``helm upgrade --reuse-values`` with ``values`` (the test node's merged under
    them), then every pod of the release's Deployments and DaemonSets is replaced from
    the new templates; returns workload name -> new pod names."""
    from lightkube.resources.core_v1 import Pod

    helm(bed, "upgrade", release, str(CHART), "--namespace", namespace, "--reuse-values",
         values=values)
    client = bed.client()
    try:
        old = [p.metadata.name for p in client.list(
            Pod, namespace=namespace, labels={"app.kubernetes.io/instance": release})
            if p.metadata.ownerReferences]
        _delete_pods(client, namespace, old, timeout_s)
    finally:
        client.close()
    return _start_workloads(bed, namespace, release)


def sync_daemonsets(bed: ChartBed, namespace: str, timeout_s: float = 90.0) -> list[str]:
    """The DaemonSet controller after node labels changed: delete the pods of
    ``namespace``'s DaemonSets on nodes their nodeSelector no longer matches, create the
    missing ones (and wait until they are Ready); returns the pods created. (A DaemonSet
    that still has a pod is left alone: the bed has one node.)"""
    from lightkube.resources.apps_v1 import DaemonSet
    from lightkube.resources.core_v1 import Node, Pod

    client = bed.client()
    created: list[str] = []
    try:
        labels = {n.metadata.name: n.metadata.labels or {} for n in client.list(Node)}
        for ds in client.list(DaemonSet, namespace=namespace):
            selector = ds.spec.template.spec.nodeSelector or {}
            pods = [p for p in client.list(Pod, namespace=namespace)
                    if any(r.uid == ds.metadata.uid for r in p.metadata.ownerReferences or [])]
            stale = [p.metadata.name for p in pods
                     if any(labels.get(p.spec.nodeName or "", {}).get(k) != v
                            for k, v in selector.items())]
            _delete_pods(client, namespace, stale, timeout_s)
            if len(pods) == len(stale):
                created += standins.run_daemonset(client, namespace, ds.metadata.name)
    finally:
        client.close()
    for pod in created:
        bed.wait_pod_ready(pod, namespace=namespace, timeout_s=180)
    return created

