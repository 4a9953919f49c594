"""DRA mode: a pod's ResourceClaims booked together against the namespace GPU quota, as
extender mode books the pod (the core's collapse: the peak of the init containers or the
sum of the app containers, sidecars held for the pod's life, KEP-753). Pure.

A translated pod gets one claim per GPU container, each a separate object that holds its
share for the pod's whole life, so counted one by one a pod with a 10000 MiB GPU init
container and a 10000 MiB GPU app container books 20000 MiB where extender mode books
10000. Grouping claims under their pod is sound only for claims hami can prove are the
pod's: ``ownerReferences`` and the ``resource.kubernetes.io/pod-claim-name`` annotation
are metadata any tenant allowed to create claims may write, on its own claims or, later,
on the pod's.

The proof: the API server puts the authenticated user of a request in its
AdmissionReview (``request.userInfo``), which no client can forge, and, for a validating
webhook, the claim's server-assigned, immutable ``metadata.uid``. kube-controller-manager's
resourceclaim controller creates a pod's claims from the templates the pod names, under
its own identity (:data:`TRUSTED_CREATORS`: the ``resource-claim-controller`` service
account with ``--use-service-account-credentials``, else ``system:kube-controller-manager``),
with the pod as controller owner and the pod's entry name in the annotation. A claim CREATE
from one of those identities is therefore recorded (:func:`trusted_record`) as
``(claim UID, pod UID, entry)``, on hami's own Lease (:mod:`hami.dra.reservations`; no
tenant writes it), from the values the controller wrote then. Whatever the claim's
metadata says later is not read again.

:func:`namespace_charge` books a recorded claim under its pod when the pod is live (a pod
of that UID in the namespace), its spec names the entry with a template (a claim the pod
names by ``resourceClaimName`` can be any claim), no pod but its own reserves it
(``status.reservedFor``: a claim other pods share is used beside the pod's other claims),
and no other claim is booked for the same entry. Every other claim, a tenant's with forged
owners included, counts in full, so grouping can never book less than counting each claim
would for a claim hami did not see the controller create.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hami.core.collapse import Role, phase_request, role_of
from hami.core.podobjects import list_or_empty, mapping_or_empty, sidecar_positions

__all__ = ["ANNOTATION", "TRUSTED_CREATORS", "Held", "NamespaceCharge", "PodClaimRecord",
           "dump", "held_of", "namespace_charge", "parse", "trusted_record"]

#: The identities kube-controller-manager's resourceclaim controller creates claims as:
#: its service account (``--use-service-account-credentials``, kubeadm's default) and the
#: controller manager's own user otherwise. Only cluster components hold them.
TRUSTED_CREATORS = ("system:serviceaccount:kube-system:resource-claim-controller",
                    "system:kube-controller-manager")
#: The resourceclaim controller's annotation on a pod's claim: the pod's entry name.
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
#: The Lease annotation holding the records (JSON ``[[claim UID, pod UID, entry, unix
#: time], ...]``).
ANNOTATION = "hami.io/dra-pod-claims"
#: The most bytes of records one Lease holds (the API limits an object's annotations to
#: 256 KiB); a claim that would go past it is not recorded and counts in full.
MAX_RECORDS_BYTES = 160 * 1024


@dataclass(frozen=True, slots=True)
class PodClaimRecord:
    """A claim the resourceclaim controller created: its ``claim_uid``, the ``pod_uid``
    of its controller owner and the pod's ``entry`` name, as the controller wrote them,
    and when it was admitted (``at``, unix seconds)."""

    claim_uid: str
    pod_uid: str
    entry: str
    at: float


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def trusted_record(request: Mapping[str, Any], trusted: Iterable[str], now: float
                   ) -> PodClaimRecord | None:
    """The record of a ResourceClaim CREATE ``request`` (an AdmissionReview ``request``)
    made by one of the ``trusted`` users for a pod, None for any other: another user, no
    ``metadata.uid`` (a mutating webhook's review: the API server assigns it after
    mutation), not exactly one controller owner, that owner not a v1 Pod with a UID, or no
    entry annotation. Pure; never raises."""
    if _text(mapping_or_empty(request.get("userInfo")).get("username")) not in set(trusted):
        return None
    meta = mapping_or_empty(mapping_or_empty(request.get("object")).get("metadata"))
    uid = _text(meta.get("uid"))
    owners = [o for o in meta.get("ownerReferences") or []
              if isinstance(o, Mapping) and o.get("controller") is True]
    entry = _text(mapping_or_empty(meta.get("annotations")).get(POD_CLAIM_NAME))
    if not uid or not entry or len(owners) != 1:
        return None
    owner = owners[0]
    if owner.get("kind") != "Pod" or owner.get("apiVersion") != "v1" \
            or not _text(owner.get("uid")):
        return None
    return PodClaimRecord(uid, str(owner["uid"]), entry, float(now))


def parse(text: Any) -> list[PodClaimRecord]:
    """The records of an :data:`ANNOTATION` value; entries not of the written shape are
    dropped (hami writes it; a malformed value holds none, so its claims count in
    full)."""
    try:
        raw = json.loads(text) if isinstance(text, str) else []
    except ValueError:
        return []
    out = []
    for item in raw if isinstance(raw, list) else []:
        if (isinstance(item, list) and len(item) == 4
                and all(isinstance(v, str) and v for v in item[:3])
                and isinstance(item[3], int | float) and not isinstance(item[3], bool)):
            out.append(PodClaimRecord(item[0], item[1], item[2], float(item[3])))
    return out


def dump(records: Iterable[PodClaimRecord]) -> str:
    """The :data:`ANNOTATION` value for ``records``."""
    return json.dumps([[r.claim_uid, r.pod_uid, r.entry, round(r.at, 3)] for r in records],
                      separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Held:
    """One claim as the namespace total counts it: ``name``, ``uid`` ("" unknown), what it
    books (``memory_mib``, ``cores_percent``) and the UIDs of the pods its
    ``status.reservedFor`` names."""

    name: str
    uid: str
    memory_mib: int
    cores_percent: int
    reserved_for: frozenset[str] = frozenset()


def held_of(claim: Mapping[str, Any], booked: tuple[int, int]) -> Held:
    """The :class:`Held` of a stored ResourceClaim (a dict) booking ``booked``. Never
    raises."""
    meta = mapping_or_empty(claim.get("metadata"))
    refs = mapping_or_empty(claim.get("status")).get("reservedFor")
    users = frozenset(_text(mapping_or_empty(r).get("uid")) for r in refs) \
        if isinstance(refs, list) else frozenset()
    return Held(_text(meta.get("name")), _text(meta.get("uid")), booked[0], booked[1], users)


@dataclass(frozen=True, slots=True)
class NamespaceCharge:
    """What a namespace's claims book: ``memory_mib``, ``cores_percent``, and
    ``grouped``: the names of the claims booked under their pod (claim name -> pod
    name)."""

    memory_mib: int
    cores_percent: int
    grouped: dict[str, str] = field(default_factory=dict)


def _template_entries(pod: Mapping[str, Any]) -> set[str]:
    entries = mapping_or_empty(pod.get("spec")).get("resourceClaims")
    return {_text(e.get("name")) for e in entries if isinstance(e, Mapping)
            and _text(e.get("resourceClaimTemplateName")) and _text(e.get("name"))} \
        if isinstance(entries, list) else set()


def _containers(pod: Mapping[str, Any]) -> list[tuple[Role, set[str]]]:
    """``(role, entry names its resources.claims use)`` per container, init first."""
    spec = mapping_or_empty(pod.get("spec"))
    init = spec.get("initContainers")
    init = init if isinstance(init, list) else []
    app = spec.get("containers")
    app = app if isinstance(app, list) else []
    sidecars = sidecar_positions(pod)
    out = []
    for pos, c in enumerate([*init, *app]):
        claims = mapping_or_empty(mapping_or_empty(c).get("resources")).get("claims")
        used = {_text(mapping_or_empty(x).get("name")) for x in list_or_empty(claims)}
        out.append((role_of(pos, len(init), sidecars), used - {""}))
    return out


def namespace_charge(held: Iterable[Held], pods: Iterable[Mapping[str, Any]],
                     records: Iterable[PodClaimRecord]) -> NamespaceCharge:
    """What ``held`` (the namespace's claims, and claims admitted but not stored yet)
    books in all, with ``pods`` (the namespace's pods, dicts) and ``records`` (from the
    Lease). A claim whose UID has a record is booked under the record's pod when that pod
    is in ``pods``, names the record's entry with a template, is the only pod its
    ``status.reservedFor`` names (if any), and no claim before it took that entry; each
    such pod books :func:`hami.core.collapse.phase_request` of its grouped claims (claims
    its containers do not name held in every phase). Every other claim books in full.
    Pure; never raises on malformed objects (they count in full)."""
    by_uid = {r.claim_uid: r for r in records}
    live: dict[str, Mapping[str, Any]] = {}
    for pod in pods:
        uid = (_text(mapping_or_empty(pod.get("metadata")).get("uid"))
               if isinstance(pod, Mapping) else "")
        if uid:
            live[uid] = pod
    mem = cores = 0
    groups: dict[str, dict[str, tuple[int, int]]] = {}
    grouped: dict[str, str] = {}
    for h in held:
        rec = by_uid.get(h.uid) if h.uid else None
        owner = live.get(rec.pod_uid) if rec else None
        if (rec is None or owner is None or rec.entry not in _template_entries(owner)
                or not h.reserved_for <= {rec.pod_uid}
                or rec.entry in groups.get(rec.pod_uid, {})):
            mem, cores = mem + h.memory_mib, cores + h.cores_percent
            continue
        groups.setdefault(rec.pod_uid, {})[rec.entry] = (h.memory_mib, h.cores_percent)
        grouped[h.name] = _text(mapping_or_empty(owner.get("metadata")).get("name"))
    for pod_uid, bookings in groups.items():
        containers = _containers(live[pod_uid])
        used = set().union(*(objs for _, objs in containers)) if containers else set()
        m, c = phase_request(containers, bookings, set(bookings) - used)
        mem, cores = mem + m, cores + c
    return NamespaceCharge(mem, cores, grouped)
