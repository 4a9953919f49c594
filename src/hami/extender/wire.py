"""Extender v1 wire shapes (``k8s.io/kube-scheduler/extender/v1``, HAMi v2.10).

The Go types have no JSON tags, so the Go field names are on the wire and Go decodes
keys case-insensitively; this module does the same. Parsers return a value or raise
:class:`WireError` with a message for the ``Error`` field; they never raise anything else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]


class WireError(ValueError):
    """A request body that cannot be used; the message goes back in ``Error``."""


def decode_body(body: bytes) -> JSON:
    """A JSON object from a request body (Go ``json.Decoder`` accepts trailing space)."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise WireError(f"invalid JSON body: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise WireError(f"expected a JSON object, got {type(value).__name__}")
    return value


def field(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]``, matching keys case-insensitively as Go's encoding/json does (an exact
    match wins)."""
    if name in obj:
        return obj[name]
    folded = name.casefold()
    for key, value in obj.items():
        if isinstance(key, str) and key.casefold() == folded:
            return value
    return None


def _string(obj: Mapping[str, Any], name: str) -> str:
    value = field(obj, name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise WireError(f"{name} must be a string, got {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class FilterArgs:
    """ExtenderArgs: the pod, and either ``node_names`` (nodeCacheCapable) or ``nodes``."""

    pod: JSON
    node_names: list[str] | None
    nodes: list[JSON] | None


def _pod(value: Any) -> JSON:
    if value is None:
        raise WireError("extender args missing pod")
    if not isinstance(value, dict):
        raise WireError(f"Pod must be an object, got {type(value).__name__}")
    meta = value.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise WireError("Pod.metadata must be an object")
    for key in ("spec", "status"):
        if value.get(key) is not None and not isinstance(value[key], dict):
            raise WireError(f"Pod.{key} must be an object")
    return value


def parse_filter_args(body: bytes) -> FilterArgs:
    """ExtenderArgs from a ``/filter`` body."""
    obj = decode_body(body)
    pod = _pod(field(obj, "Pod"))
    names = field(obj, "NodeNames")
    if names is not None and (not isinstance(names, list)
                              or not all(isinstance(n, str) for n in names)):
        raise WireError("NodeNames must be a list of strings")
    nodes = field(obj, "Nodes")
    items: list[JSON] | None = None
    if nodes is not None:
        if not isinstance(nodes, dict):
            raise WireError("Nodes must be a NodeList object")
        raw = field(nodes, "items") or []
        if not isinstance(raw, list) or not all(isinstance(n, dict) for n in raw):
            raise WireError("Nodes.items must be a list of Node objects")
        items = raw
    return FilterArgs(pod, names, items)


@dataclass(frozen=True, slots=True)
class BindArgs:
    """ExtenderBindingArgs."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def parse_bind_args(body: bytes) -> BindArgs:
    """ExtenderBindingArgs from a ``/bind`` body."""
    obj = decode_body(body)
    args = BindArgs(_string(obj, "PodName"), _string(obj, "PodNamespace"),
                    _string(obj, "PodUID"), _string(obj, "Node"))
    if not args.pod_name or not args.node:
        raise WireError("extender binding args need PodName and Node")
    return args


@dataclass(frozen=True, slots=True)
class PreemptArgs:
    """ExtenderPreemptionArgs: the pod, and per node the UIDs of the victims
    kube-scheduler's dry run chose there with their PDB violation count (from
    ``NodeNameToMetaVictims``, or ``NodeNameToVictims``' pods when not node-cache capable)."""

    pod: JSON
    victims: dict[str, tuple[str, ...]]
    violations: dict[str, int]


def _victims(value: Any, *, meta: bool) -> tuple[tuple[str, ...], int]:
    if value is None:
        return (), 0
    if not isinstance(value, dict):
        raise WireError("victims must be objects")
    pods = field(value, "Pods") or []
    count = field(value, "NumPDBViolations") or 0
    if not isinstance(pods, list) or isinstance(count, bool) or not isinstance(count, int):
        raise WireError("victims need a list of Pods and an integer NumPDBViolations")
    uids = []
    for pod in pods:
        if not isinstance(pod, dict):
            raise WireError("a victim pod must be an object")
        pod_meta = pod.get("metadata")
        uid = field(pod, "UID") if meta else (
            pod_meta.get("uid") if isinstance(pod_meta, dict) else None)
        if not isinstance(uid, str) or not uid:
            raise WireError("a victim pod has no UID")
        uids.append(uid)
    return tuple(uids), count


def parse_preempt_args(body: bytes) -> PreemptArgs:
    """ExtenderPreemptionArgs from a ``/preempt`` body."""
    obj = decode_body(body)
    pod = _pod(field(obj, "Pod"))
    meta = field(obj, "NodeNameToMetaVictims")
    full = field(obj, "NodeNameToVictims")
    table = meta if meta is not None else full
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise WireError("NodeNameToMetaVictims must be an object")
    victims, violations = {}, {}
    for node, value in table.items():
        victims[node], violations[node] = _victims(value, meta=meta is not None)
    return PreemptArgs(pod, victims, violations)


def preempt_result(victims: Mapping[str, tuple[Sequence[str], int]]) -> JSON:
    """ExtenderPreemptionResult: per node kept, the victims' UIDs and PDB violations."""
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": count}
        for node, (uids, count) in victims.items()}}


def filter_result(*, node_names: Sequence[str] | None = None, nodes: list[JSON] | None = None,
                  failed: Mapping[str, str] | None = None, error: str = "",
                  nodes_list: bool = False) -> JSON:
    """ExtenderFilterResult with all five keys, as Go emits them (null when unset)."""
    return {
        "Nodes": {"metadata": {}, "items": nodes} if nodes_list else None,
        "NodeNames": list(node_names) if node_names is not None else None,
        "FailedNodes": dict(failed) if failed else None,
        "FailedAndUnresolvableNodes": None,
        "Error": error,
    }


def bind_result(error: str = "") -> JSON:
    """ExtenderBindingResult."""
    return {"Error": error}
