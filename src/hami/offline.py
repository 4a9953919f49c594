"""``hami schedule``: the offline scheduler (a dry run of admission + filter).

Input is a YAML or JSON stream (or a ``kind: List``) of v1 Nodes carrying HAMi register
annotations (or, for capacity-based vendors such as Cambricon, ``status.capacity``), v1
Pods and optionally v1 ResourceQuotas. Pods with ``spec.nodeName`` and an allocated
annotation of any registered vendor (``hami.io/vgpu-devices-allocated``,
``hami.io/dcu-devices-allocated``, ...) are existing usage; every other pod is admitted
(the webhook's logic, every vendor) and then scheduled in file order, each seeing the
decisions before it. A pod that fits nowhere gets the preemption hami would make for it
(``preemption``: victims of lower ``spec.priority``, the card, the freed slice;
:mod:`hami.core.preemption`, PodDisruptionBudgets of the file counted) without making
it: the victims stay. The decisions come from :class:`hami.core.state.ClusterState`, the
same code as the live ``/filter``. A pod without ``metadata.name`` (a controller's
template with ``generateName``, a manifest before ``kubectl create``) and without a uid is
told apart from the others by its place in the file (``object_index``), also in the
ledger, so that two such pods are two pods. The vendors are those of ``--device-config-file`` (its
sections, HAMi v2.10; ``--enable-ascend`` / ``--enable-iluvatar`` for ``vnpus`` and
``iluvatars``); without a device config only NVIDIA is known.

JSON output schema (stable; ``schema`` is bumped on any incompatible change)::

    {
      "schema": "hami.schedule/v1",
      "nodes": {"<node>": "" | "<why it was not registered>"},
      "node_warnings": {"<node>": "<devices skipped on a registered node, and why>"},
      "pods": [
        {
          "namespace": str, "name": str,          # name: "" for a pod without one
          "generate_name": str,                   # metadata.generateName, or ""
          "object_index": int,                    # its place among the file's objects, 1-based
          "admission": {"allowed": bool, "message": str, "patch": [RFC 6902 ops]},
          "node": str | null,
          "annotations": {"hami.io/vgpu-node": str,
                          "hami.io/vgpu-devices-to-allocate": str,
                          "hami.io/vgpu-devices-allocated": str,
                          ...every other granted vendor's annotations,
                          e.g. "hami.io/dcu-devices-allocated": str},  # {} when unscheduled
          "failed_nodes": {"<node>": "<HAMi reason>"},               # {} when scheduled
          "preemption": null | {                # unscheduled: what preemption would do
            "node": str, "cards": [str],        # where the pod would go, its cards
            "pdb_violations": int,
            "victims": [{"namespace": str, "name": str, "priority": int,
                         "freed": [{"uuid": str, "memory_mib": int,
                                    "cores_percent": int, "slots": int}]}],
            "freed_on_cards": {"<uuid>": {"memory_mib": int, "cores_percent": int,
                                          "slots": int}}
          },
          "error": str                                               # "" unless the pod is unusable
        }
      ]
    }
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NoReturn

import yaml

from hami.api import names
from hami.core.admission import admit
from hami.core.config import SchedulerConfig
from hami.core.filter import FilterError
from hami.core.podpriority import Budget, pod_priority_info
from hami.core.preemption import PreemptionPlan, plan_preemption
from hami.core.request import RequestError
from hami.core.state import ClusterState, pod_uid
from hami.devices.registry import make_config

SCHEMA = "hami.schedule/v1"


class InputError(ValueError):
    """The cluster file cannot be read as Kubernetes objects."""


_UNMARSHAL = re.compile(r"json: cannot unmarshal (\w+)(?: (\S+))? into Go struct field "
                        r"\w+\.(\w+) of type (\S+)")
_LEGACY = ("node annotation missing device separator", "malformed node annotation segment",
           "unexpected field count", "field: ")


def user_reason(reason: str) -> str:
    """A node registration failure in the user's terms: what is wrong with the device
    register annotation, with the scheduler's own wording (HAMi's, which events and logs
    keep) in parentheses. Other reasons are returned unchanged."""
    detail = reason.split(": ", 1)[1] if reason.startswith("node ") and ": " in reason \
        else reason
    match = _UNMARSHAL.search(detail)
    if match:
        got, value, field, want = match.groups()
        shown = f"{got} {value}" if value else got
        where = detail.split(": json:", 1)[0].removeprefix("node register annotation ")
        return (f"the device register annotation's {where}: field {field!r} must be of "
                f"type {want}, got {shown} ({detail})")
    if "invalid JSON" in detail:
        return f"the device register annotation is not valid JSON ({detail})"
    if any(marker in detail for marker in _LEGACY):
        return ("the device register annotation is neither a JSON list of devices nor "
                "HAMi's older id,count,devmem,devcore,type,numa,health: text form "
                f"({detail})")
    return reason


def load_objects(text: str) -> list[dict[str, Any]]:
    """Parse a YAML/JSON stream into objects, flattening ``kind: List`` items.

    The fields hami reads are checked for the types the API server guarantees (maps,
    lists, string annotation values), so a hand-written file fails here with the path of
    the bad field instead of deep in the scheduler.

    Raises:
        InputError: not YAML, a document that is not an object with ``kind``, or a field
            of a Node, Pod or ResourceQuota of the wrong type.
    """
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML/JSON: {exc}") from None
    objects = list(_flatten(docs))
    for obj in objects:
        _check_shape(obj)
    return objects


def _check_shape(obj: Mapping[str, Any]) -> None:
    kind = obj["kind"]
    if kind not in ("Node", "Pod", "ResourceQuota"):
        return
    meta = obj.get("metadata")
    who = f"{kind} {(meta or {}).get('name', '?') if isinstance(meta, dict) else '?'}"

    def fail(path: str, want: str, got: Any) -> NoReturn:
        hint = " (quote the value in YAML)" if want == "a string" else ""
        raise InputError(f"{who}: {path} must be {want}, got {got!r}{hint}")

    def mapping(value: Any, path: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            fail(path, "a mapping", value)
        return value

    meta = mapping(meta, "metadata")
    for key in ("name", "namespace", "uid"):
        if key in meta and not isinstance(meta[key], str):
            fail(f"metadata.{key}", "a string", meta[key])
    for field_name in ("annotations", "labels"):
        for key, value in mapping(meta.get(field_name), f"metadata.{field_name}").items():
            if not isinstance(value, str):
                fail(f"metadata.{field_name}[{key!r}]", "a string", value)
    spec = mapping(obj.get("spec"), "spec")
    status = mapping(obj.get("status"), "status")
    if kind == "Node":
        for field_name in ("capacity", "allocatable"):
            mapping(status.get(field_name), f"status.{field_name}")
    elif kind == "ResourceQuota":
        mapping(spec.get("hard"), "spec.hard")
    else:
        for group in ("initContainers", "containers"):
            ctrs = spec.get(group)
            if ctrs is None:
                continue
            if not isinstance(ctrs, list):
                fail(f"spec.{group}", "a list", ctrs)
            for n, ctr in enumerate(ctrs):
                path = f"spec.{group}[{n}]"
                ctr = mapping(ctr, path)
                if "name" in ctr and not isinstance(ctr["name"], str):
                    fail(f"{path}.name", "a string", ctr["name"])
                res = mapping(ctr.get("resources"), f"{path}.resources")
                for part in ("limits", "requests"):
                    for key, value in mapping(res.get(part), f"{path}.resources.{part}").items():
                        if isinstance(value, bool) or not isinstance(value, str | int | float):
                            fail(f"{path}.resources.{part}[{key!r}]", "a quantity", value)
                mapping(ctr.get("securityContext"), f"{path}.securityContext")
        if "initContainerStatuses" in status and not isinstance(
                status["initContainerStatuses"], list):
            fail("status.initContainerStatuses", "a list", status["initContainerStatuses"])


def _flatten(docs: Iterable[Any]) -> Iterator[dict[str, Any]]:
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc:
            raise InputError(f"expected Kubernetes objects with a kind, got {str(doc)[:80]!r}")
        if doc["kind"] == "List" or doc["kind"].endswith("List"):
            yield from _flatten(doc.get("items") or [])
        else:
            yield doc


def _is_existing(pod: Mapping[str, Any], state: ClusterState) -> bool:
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    keys = [names.DEVICES_ALLOCATED, *(v.allocated_key for v in state.vendors.values())]
    return bool((pod.get("spec") or {}).get("nodeName")) and any(k in ann for k in keys)


def schedule(objects: Iterable[Mapping[str, Any]],
             config: SchedulerConfig | None = None) -> dict[str, Any]:
    """Run the dry run; returns the JSON-shaped report described in the module doc."""
    state = ClusterState(config or make_config())
    objects = list(objects)
    report: dict[str, Any] = {"schema": SCHEMA, "nodes": {}, "node_warnings": {}, "pods": []}
    node_names: list[str] = []
    budgets = [Budget.from_object(o) for o in objects
               if o.get("kind") == "PodDisruptionBudget"]
    #: Charged pods (existing ones, then those placed here) for preemption, by uid.
    charged: dict[str, Mapping[str, Any]] = {}
    for obj in objects:
        if obj.get("kind") == "Node":
            name = (obj.get("metadata") or {}).get("name", "")
            node_names.append(name)
            report["nodes"][name] = user_reason(state.upsert_node(obj))
            skipped = state.vendor_reasons.get(name) or {}
            if not report["nodes"][name] and skipped:
                report["node_warnings"][name] = "; ".join(skipped[w] for w in sorted(skipped))
        elif obj.get("kind") == "ResourceQuota":
            state.upsert_quota(obj)
    pending = []
    for index, obj in enumerate(objects, start=1):
        if obj.get("kind") != "Pod":
            continue
        obj = _identified(obj, index)
        if _is_existing(obj, state):
            existing = dict(obj)
            meta = dict(existing.get("metadata") or {})
            ann = dict(meta.get("annotations") or {})
            ann.setdefault(names.VGPU_NODE, existing["spec"]["nodeName"])
            meta["annotations"] = ann
            existing["metadata"] = meta
            if state.upsert_pod(existing):
                charged[pod_uid(existing)] = existing
        else:
            pending.append((index, obj))
    for index, pod in pending:
        entry = _schedule_one(state, pod, node_names, charged, budgets)
        meta = pod.get("metadata") or {}
        entry["generate_name"] = str(meta.get("generateName") or "")
        entry["object_index"] = index
        report["pods"].append(entry)
    return report


#: The uid prefix :func:`_identified` gives a pod with neither name nor uid.
DRY_RUN_UID_PREFIX = "hami-schedule-object-"


def _identified(pod: Mapping[str, Any], index: int) -> Mapping[str, Any]:
    """``pod`` itself, or for one with neither ``metadata.name`` nor ``metadata.uid`` a
    copy with the uid ``hami-schedule-object-<index>``: the ledger tells pods apart by
    uid, else by ``namespace/name``, so nameless pods would all be one pod there (the
    second replacing the first's charge)."""
    meta = pod.get("metadata") or {}
    if meta.get("name") or meta.get("uid"):
        return pod
    return {**pod, "metadata": {**meta, "uid": f"{DRY_RUN_UID_PREFIX}{index}"}}


def _preemption(state: ClusterState, pod: Mapping[str, Any], node_names: list[str],
                charged: Mapping[str, Mapping[str, Any]],
                budgets: list[Budget]) -> dict[str, Any] | None:
    """The preemption hami would make for an unscheduled pod, as report JSON (None:
    none helps, or the pod may not preempt)."""
    infos = {uid: pod_priority_info(p, budgets) for uid, p in charged.items()
             if state.ledger.pod(uid) is not None}
    try:
        plan = plan_preemption(state, pod, infos, {b.key: b.allowed for b in budgets},
                               node_names).plan
    except (RequestError, FilterError):
        return None
    return None if plan is None or not plan.victims else _plan_json(plan)


def _plan_json(plan: PreemptionPlan) -> dict[str, Any]:
    def charge(uuid: str, m: int, c: int, s: int) -> dict[str, Any]:
        return {"uuid": uuid, "memory_mib": m, "cores_percent": c, "slots": s}

    return {"node": plan.node, "cards": list(plan.cards()),
            "pdb_violations": plan.violations,
            "victims": [{"namespace": v.namespace, "name": v.name, "priority": v.priority,
                         "freed": [charge(f.uuid, f.memory_mib, f.cores_percent, f.slots)
                                   for f in v.freed]} for v in plan.victims],
            "freed_on_cards": {u: {"memory_mib": m, "cores_percent": c, "slots": s}
                               for u, (m, c, s) in plan.freed_on_cards().items()}}


def _schedule_one(state: ClusterState, pod: Mapping[str, Any], node_names: list[str],
                  charged: dict[str, Mapping[str, Any]],
                  budgets: list[Budget]) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    entry: dict[str, Any] = {"namespace": meta.get("namespace") or "default",
                             "name": meta.get("name") or "", "node": None,
                             "annotations": {}, "failed_nodes": {}, "preemption": None,
                             "error": ""}
    verdict = admit(pod, state.config, state.quota, vendor_quota=state.vendor_quota)
    entry["admission"] = {"allowed": verdict.allowed, "message": verdict.message,
                          "patch": verdict.patch}
    if not verdict.allowed:
        return entry
    try:
        decision = state.filter(verdict.pod, node_names, now_ns=time.time_ns())
    except (RequestError, FilterError) as exc:
        entry["error"] = str(exc)
        return entry
    if decision.result.passthrough:
        known = ", ".join(["NVIDIA", *sorted(state.vendors)])
        entry["error"] = (f"pod requests no device of {known}; left to kube-scheduler"
                          + ("" if state.vendors else
                             " (other vendors need --device-config-file with their sections)"))
        return entry
    wanted = state.config.scheduler_name
    scheduler = (verdict.pod.get("spec") or {}).get("schedulerName") or ""
    if wanted and scheduler != wanted:
        # kube-scheduler calls hami's extender only for pods of hami's profile: a pod the
        # webhook left with another scheduler is never placed or charged here.
        entry["error"] = (f"schedulerName is {scheduler!r}, not {wanted!r}: "
                          "not scheduled by hami")
        return entry
    entry["node"] = decision.result.node
    entry["annotations"] = decision.annotations
    if decision.result.node is None:
        entry["failed_nodes"] = dict(sorted(decision.result.failed_nodes.items()))
        entry["preemption"] = _preemption(state, verdict.pod, node_names, charged, budgets)
    else:
        state.commit(verdict.pod, decision)
        charged[pod_uid(verdict.pod)] = verdict.pod
    return entry
