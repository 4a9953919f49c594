"""``hami top``: nodes and GPUs with what is allocated on them, for people.

DRA mode's nodes come from the ResourceSlices and the claims' allocations instead
(:mod:`hami.dra.usage`).

The view is computed by the pure core exactly as the scheduler computes usage: every Node
goes through :meth:`ClusterState.upsert_node` (the ``hami.io/node-nvidia-register``
annotation), every Pod through :meth:`ClusterState.upsert_pod` (HAMi's membership rules
on ``hami.io/vgpu-node`` / ``hami.io/vgpu-devices-allocated``), every ResourceQuota
through :meth:`ClusterState.upsert_quota`; the table is then read from the ledger. Only
the listing of the objects talks to the cluster (lightkube). The text tables are
:mod:`hami.toptable`'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from hami.api import names
from hami.cliargs import choose, completer
from hami.core.config import SchedulerConfig
from hami.core.state import ClusterState
from hami.devices.registry import make_config
from hami.toptable import render_table


class TopOutput(StrEnum):
    """Output formats of ``hami top``."""

    table = "table"
    json = "json"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def strict_signing(annotations: Mapping[str, Any]) -> str:
    """Whether strict signing is on for a node, from its device plugin's
    ``hami.io/node-trust-unsigned-allocations`` annotation: ``"on"`` for ``"false"`` (only
    signed allocations served), ``"off"`` for ``"true"`` (unsigned ones served too),
    ``"unknown"`` when it is absent (an older hami plugin, HAMi's) or anything else: the
    value is node metadata and is read as untrusted input, never raising."""
    value = annotations.get(names.NODE_TRUST_UNSIGNED)
    return {"false": "on", "true": "off"}.get(value, "unknown") if isinstance(value, str) \
        else "unknown"


def cluster_view(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                 quotas: Iterable[Mapping[str, Any]] = (),
                 config: SchedulerConfig | None = None, *,
                 slices: Iterable[Mapping[str, Any]] = (),
                 claims: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Build the ``hami top`` view from plain Kubernetes objects (dicts as the API sends).

    Returns a JSON-ready dict: ``nodes`` (registered nodes with per-GPU capacity, usage
    and pods; DRA mode's nodes, from ``slices`` and the allocations of ``claims``, with
    ``"mode": "dra"``, their cards with mode ``dra`` and each card's claims:
    :func:`hami.dra.usage.dra_nodes`), ``unregistered`` (nodes without a usable register
    annotation, with the scheduler's reason; nodes that never ran the device plugin are
    left out), ``unplaced`` (pods that carry hami annotations the scheduler would not
    count, with why), ``quotas`` (namespaces with a GPU quota or GPU usage) and
    ``signing``: ``{"signed": <count>, "unsigned": [{namespace, name, node}]}`` over the
    counted pods, where a pod is ``signed`` when it carries hami's allocation signature
    annotation (``hami.io/vgpu-allocation-signature``; its validity is the device
    plugin's to check, with the key hami top does not hold). Unsigned allocations are
    those HAMi's scheduler wrote (or forged ones): a device plugin in strict mode refuses
    them, so strict signing is safe to switch on once ``unsigned`` is empty. Each node
    registered by hami's device plugin says ``strict_signing``: ``on``, ``off`` or
    ``unknown`` (:func:`strict_signing`; DRA nodes have none). Each listed
    pod of a card also says ``signed``.
    """
    from hami.dra.usage import dra_nodes
    from hami.offline import user_reason

    state = ClusterState(config or make_config())
    node_list = list(nodes)
    unregistered = []
    for node in node_list:
        meta = _meta(node)
        reason = state.upsert_node(node)
        annotations = meta.get("annotations") or {}
        if reason and names.NODE_REGISTER in annotations:
            unregistered.append({"name": meta.get("name", ""), "reason": user_reason(reason)})
    for quota in quotas:
        state.upsert_quota(quota)
    pod_names: dict[str, tuple[str, str]] = {}
    signed: dict[str, bool] = {}
    unplaced = []
    registered = set(state.ledger.node_names())
    for pod in pods:
        meta = _meta(pod)
        annotations = meta.get("annotations") or {}
        if not annotations.get(names.VGPU_NODE):
            continue
        ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        counted = state.upsert_pod(pod)
        node = annotations[names.VGPU_NODE]
        signed[str(meta.get("uid") or "")] = bool(annotations.get(names.ALLOCATION_SIGNATURE))
        phase = (pod.get("status") or {}).get("phase")
        scheduler = (pod.get("spec") or {}).get("schedulerName") or ""
        if not counted:
            if phase in ("Succeeded", "Failed"):
                why = f"phase {phase}"
            elif state.config.scheduler_name and scheduler != state.config.scheduler_name:
                why = (f"schedulerName {scheduler}: another scheduler's pod (hami top "
                       f"--scheduler-name {scheduler} counts it)")
            else:
                why = f"undecodable {names.DEVICES_ALLOCATED}"
            unplaced.append({"namespace": ns, "name": name, "node": node, "reason": why})
        elif node not in registered:
            unplaced.append({"namespace": ns, "name": name, "node": node,
                             "reason": "node not registered"})
    for entry in state.ledger.pods():
        pod_names[entry.uid] = (entry.namespace, entry.name)

    out_nodes: list[dict[str, Any]] = []
    for node_name in sorted(registered):
        node_entry = state.ledger.node(node_name)
        assert node_entry is not None
        cordoned = {u.strip() for u in node_entry.annotations.get(names.NODE_DEVICE_CORDON, "")
                    .split(",") if u.strip()}
        on_gpu: dict[str, list[dict[str, Any]]] = {}
        for pod_entry in sorted(state.ledger.pods_on(node_name),
                                key=lambda p: (p.namespace, p.name)):
            for charge in pod_entry.charges:
                on_gpu.setdefault(charge.uuid, []).append({
                    "namespace": pod_entry.namespace, "name": pod_entry.name,
                    "memory_mib": charge.memory_mib, "cores": charge.cores_percent,
                    "slots": charge.slots, "signed": signed.get(pod_entry.uid, False)})
        devices = []
        totals = {"memory_mib": [0, 0], "cores": [0, 0], "tasks": [0, 0]}
        for dev, slots, mem, cores in state.ledger.device_usage(node_name):
            devices.append({
                "index": dev.index, "uuid": dev.uuid, "type": dev.type,
                "mode": dev.mode or names.MODE_HAMI_CORE, "numa": dev.numa,
                "health": dev.health, "cordoned": dev.uuid in cordoned,
                "memory_mib": {"used": mem, "total": dev.memory_mib},
                "cores": {"used": cores, "total": dev.cores_percent},
                "tasks": {"used": slots, "total": dev.split_count},
                "pods": on_gpu.get(dev.uuid, []),
            })
            for key, used, total in (("memory_mib", mem, dev.memory_mib),
                                     ("cores", cores, dev.cores_percent),
                                     ("tasks", slots, dev.split_count)):
                totals[key][0] += used
                totals[key][1] += total
        lock = node_entry.annotations.get(names.NODE_LOCK, "")
        out_nodes.append({
            "name": node_name,
            "gpus": len(devices),
            "memory_mib": {"used": totals["memory_mib"][0], "total": totals["memory_mib"][1]},
            "cores": {"used": totals["cores"][0], "total": totals["cores"][1]},
            "tasks": {"used": totals["tasks"][0], "total": totals["tasks"][1]},
            "pods": len(state.ledger.pods_on(node_name)),
            "lock": lock,
            "strict_signing": strict_signing(node_entry.annotations),
            "devices": devices,
        })
    out_nodes = sorted([*out_nodes, *dra_nodes(slices, claims)], key=lambda n: str(n["name"]))
    quotas_out = []
    for ns, q in sorted(state.quota.namespaces().items()):
        if (q.memory_limit_mib is None and q.cores_limit_percent is None
                and not q.memory_used_mib and not q.cores_used_percent):
            continue
        quotas_out.append({"namespace": ns,
                           "memory_mib": {"used": q.memory_used_mib, "limit": q.memory_limit_mib},
                           "cores": {"used": q.cores_used_percent, "limit": q.cores_limit_percent}})
    counted_pods = [p for name in registered for p in state.ledger.pods_on(name)]
    unsigned = sorted(({"namespace": p.namespace, "name": p.name, "node": p.node}
                       for p in counted_pods if not signed.get(p.uid, False)),
                      key=lambda p: (p["namespace"], p["name"]))
    return {"nodes": out_nodes, "unregistered": unregistered,
            "unplaced": sorted(unplaced, key=lambda p: (p["namespace"], p["name"])),
            "quotas": quotas_out,
            "signing": {"signed": len(counted_pods) - len(unsigned), "unsigned": unsigned}}


def list_objects(client: Any, namespace: str | None = None) -> tuple[list[dict[str, Any]], ...]:
    """Nodes, Pods and ResourceQuotas from the cluster as plain dicts (lightkube).

    Pods of every namespace are listed even with ``namespace`` (a GPU's usage counts every
    pod on it); only when that is forbidden (403) are the namespace's own pods listed.
    ResourceQuotas are those of ``namespace`` (every one without it); ones the caller may
    not list are skipped (empty list).
    """
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Node, Pod, ResourceQuota

    ns = namespace or "*"
    nodes = [n.to_dict() for n in client.list(Node)]
    try:
        pods = [p.to_dict() for p in client.list(Pod, namespace="*")]
    except ApiError as err:
        if err.status.code != 403 or namespace is None:
            raise
        pods = [p.to_dict() for p in client.list(Pod, namespace=ns)]
    try:
        quotas = [q.to_dict() for q in client.list(ResourceQuota, namespace=ns)]
    except ApiError as err:
        if err.status.code != 403:
            raise
        quotas = []
    return nodes, pods, quotas


def _refused(err: Exception) -> int | None:
    """The HTTP status of a failed list: lightkube raises ``ApiError`` for a Kubernetes
    Status body, and the HTTP client's ``HTTPStatusError`` for the plain-text ``404 page
    not found`` an API server answers for an API group it does not serve."""
    status = getattr(getattr(err, "status", None), "code", None)
    if status is None:
        status = getattr(getattr(err, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def list_dra_objects(client: Any, namespace: str | None = None
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """ResourceSlices and ResourceClaims (DRA mode) as plain dicts (lightkube).

    Claims of every namespace (a card's usage counts every claim on it); only when that
    is forbidden (403) those of ``namespace``. A cluster without the ``resource.k8s.io/v1``
    API (404: Kubernetes before 1.34) or a caller who may not list a kind (403) gets empty
    lists.
    """
    import httpx2
    from lightkube import ApiError
    from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

    try:
        slices = [s.to_dict() for s in client.list(ResourceSlice)]
    except (ApiError, httpx2.HTTPStatusError) as err:
        if _refused(err) not in (403, 404):
            raise
        return [], []
    if not slices:
        return [], []
    try:
        claims = [c.to_dict() for c in client.list(ResourceClaim, namespace="*")]
    except (ApiError, httpx2.HTTPStatusError) as err:
        code = _refused(err)
        if code not in (403, 404):
            raise
        claims = []
        if code == 403 and namespace:
            claims = [c.to_dict() for c in client.list(ResourceClaim, namespace=namespace)]
    return slices, claims


def narrow(view: dict[str, Any], namespace: str | None, wanted_nodes: list[str] | None,
           all_nodes: list[str]) -> dict[str, Any]:
    """The view restricted for ``-n`` and ``--node``: usage figures stay the whole
    cluster's (a card used by another namespace is not shown free), only the pods listed
    are ``namespace``'s; nodes are those named.

    Raises:
        ValueError: a named node does not exist, or has no GPU registered by hami.
    """
    if wanted_nodes:
        known = set(all_nodes)
        registered = {n["name"] for n in view["nodes"]}
        for name in wanted_nodes:
            if name not in known:
                raise ValueError(f"node {name!r} does not exist")
            if name not in registered:
                raise ValueError(f"node {name!r} has no GPU registered by hami's device "
                                 "plugin")
        view["nodes"] = [n for n in view["nodes"] if n["name"] in set(wanted_nodes)]
    if namespace:
        for n in view["nodes"]:
            listed = set()
            for d in n["devices"]:
                d["pods"] = [p for p in d["pods"] if p["namespace"] == namespace]
                listed |= {p["name"] for p in d["pods"]}
            n["pods"] = len(listed)
        view["unplaced"] = [p for p in view["unplaced"] if p["namespace"] == namespace]
        if "signing" in view:
            view["signing"] = {
                "signed": len({p["name"] for n in view["nodes"] for d in n["devices"]
                               for p in d["pods"] if p.get("signed")}),
                "unsigned": [p for p in view["signing"]["unsigned"]
                             if p["namespace"] == namespace]}
        view["quotas"] = [q for q in view["quotas"] if q["namespace"] == namespace]
    return view


def top(
    output: Annotated[str, typer.Option(
        "-o", "--output", help="table | json", metavar="[" + "|".join(TopOutput) + "]",
        autocompletion=completer(list(TopOutput)))] = TopOutput.table.value,
    kubeconfig: Annotated[Path | None, typer.Option(envvar="KUBECONFIG",
                                                    help="default: in-cluster or ~/.kube/config")] = None,
    context: Annotated[str | None, typer.Option(help="kubeconfig context")] = None,
    namespace: Annotated[str | None, typer.Option(
        "-n", "--namespace", help="only pods and quotas of this namespace (GPU usage is "
        "still every namespace's)")] = None,
    node: Annotated[list[str] | None, typer.Option(
        "--node", metavar="<name>", help="only this node (repeatable)")] = None,
    device_config_file: Annotated[Path | None, typer.Option(
        "--device-config-file", help="HAMi device-config.yaml (resource names for quotas)")
    ] = None,
    scheduler_name: Annotated[str, typer.Option(
        "--scheduler-name", help="count the pods of this scheduler (the chart's "
        "schedulerName; e.g. hami-py-scheduler beside HAMi)")] = "hami-scheduler",
) -> None:
    """GPUs of the cluster: allocated memory, cores and tasks vs capacity, and their pods."""
    from lightkube import ApiError, Client

    from hami.core.config import ConfigError as HamiConfigError
    from hami.kubehint import kube_hint, load_kubeconfig
    from hami.settings import load_device_config

    fmt = TopOutput(choose(output, list(TopOutput), "-o/--output"))
    try:
        config = make_config(nvidia=load_device_config(device_config_file),
                             scheduler_name=scheduler_name)
        kc = load_kubeconfig(kubeconfig)
        client = Client(kc.get(context_name=context) if context else kc, trust_env=False)
        nodes, pods, quotas = list_objects(client, namespace)
        slices, claims = list_dra_objects(client, namespace)
    except (ApiError, HamiConfigError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except Exception as exc:  # kubeconfig, transport errors (refused, TLS, DNS), files
        typer.echo(f"error: {kube_hint(exc) or exc}", err=True)
        raise typer.Exit(2) from None
    view = cluster_view(nodes, pods, quotas, config, slices=slices, claims=claims)
    try:
        view = narrow(view, namespace, node,
                      [str(_meta(n).get("name") or "") for n in nodes])
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if fmt is TopOutput.json:
        typer.echo(json.dumps(view, indent=2))
    else:
        typer.echo(render_table(view), nl=False)


if __name__ == "__main__":  # `python -m hami.top`: the command without the `hami` CLI
    typer.run(top)
