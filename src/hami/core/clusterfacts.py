"""What the API server offers, and what hami does with it. Pure.

At start-up the scheduler and the DRA plugin read the server's ``/version`` and its API
group list (``/api``'s ``v1`` and ``/apis``: every ``group/version`` it serves), through
:mod:`hami.clusterprobe`, into :class:`ClusterFacts`; the functions here decide from that:

* :func:`binding_copies_labels`: the API server copies a Binding's labels onto the pod
  only in newer releases (the ``PodTopologyLabelsAdmission`` work, KEP-4742): measured,
  v1.31.14 and v1.33.13 drop them, v1.35.4 and v1.37.2 copy them (bench/results/
  compat_matrix_notes.md); 1.34 was not run and counts as dropping. Where they are
  dropped the scheduler writes the pod's ``hami.io/vgpu-node`` label with a patch after
  the Binding, as the monitor selects pods by it (a patch where they were copied would
  only cost one write).
* :func:`dra_refusal`: DRA mode needs ``resource.k8s.io/v1`` (GA in Kubernetes 1.34) and
  consumable capacity (``DRAConsumableCapacity``: alpha in 1.34, beta and on by default
  from 1.36; docs/dra.md). Without ``resource.k8s.io/v1`` hami refuses DRA mode with one
  line; on 1.34 and 1.35 it goes on only where consumable capacity is known to be on
  (the DRA plugin checks that with a dry-run ResourceSlice, :func:`capacity_refusal`).
* MIG in DRA mode needs two more: partitionable devices (``DRAPartitionableDevices``,
  KEP-4815: a MIG card's counter set and the instances consuming it; alpha and off in
  v1.33.13 and v1.35.4, beta and on in v1.36.3 and v1.37.2, where it can still be turned
  off) for the DRA plugin of a node in ``mig`` mode, which therefore always sends the
  dry-run slice, with a MIG instance in it (:func:`slice_refusal`); and
  prioritized lists (``DRAPrioritizedList``, KEP-4816: the webhook's ``firstAvailable``
  requests; beta and on in v1.35.4, GA but still switchable in v1.36.3, locked on in
  v1.37.2) for the scheduler, checked with a dry-run ResourceClaimTemplate before 1.37
  (:func:`needs_prioritized_list_check`, :func:`prioritized_list_refusal`). The
  releases are those the API servers' ``--help`` and ``--feature-gates`` name.

The Kubernetes versions are those of the Kubernetes release notes and KEPs named above.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: First minor (of 1.x) whose API server is known to copy a Binding's labels onto the pod
#: (measured: 1.33 does not, 1.35 does; 1.34 not run).
BINDING_LABELS_MINOR = 35
#: The DRA API group and version DRA mode uses.
DRA_GROUP_VERSION = "resource.k8s.io/v1"
#: First minor with ``DRAConsumableCapacity`` on by default.
CONSUMABLE_CAPACITY_DEFAULT_MINOR = 36
#: First minor with ``DRAPrioritizedList`` locked on (v1.35.4: beta, on but can be turned
#: off; v1.36.3: GA, still accepts ``=false`` with a warning; v1.37.2 refuses
#: ``--feature-gates=DRAPrioritizedList=false``).
PRIORITIZED_LIST_LOCKED_MINOR = 37
#: First minor serving ValidatingAdmissionPolicy in admissionregistration.k8s.io/v1 (GA).
VAP_MINOR = 30
#: Longest version word looked at.
_MAX_LEN = 128
_GIT_VERSION = re.compile(r"v?(\d{1,4})\.(\d{1,4})\.(\d{1,6})\S*")
_MINOR = re.compile(r"(\d{1,4})\+?")


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """What one API server said: ``git_version`` (``/version``'s ``gitVersion``, e.g.
    ``v1.31.14``, or ``""``), ``release`` (``(major, minor)``, None when it does not parse)
    and ``served`` (every ``group/version`` it serves, ``v1`` for the core group)."""

    git_version: str
    release: tuple[int, int] | None
    served: frozenset[str]

    def serves(self, group_version: str) -> bool:
        """Whether ``group_version`` (``resource.k8s.io/v1``) is served."""
        return group_version in self.served

    @property
    def shown(self) -> str:
        """The version for a log line (``v1.31.14``, or ``an unknown version``)."""
        return self.git_version or "an unknown version"


def parse_release(version_doc: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(major, minor)`` from a ``/version`` document: ``gitVersion`` (``v1.31.14``,
    ``v1.30.2-eks-1a2b``) first, else ``major``/``minor`` (``"1"``, ``"31+"`` as some
    managed servers say). None when neither parses."""
    git = version_doc.get("gitVersion")
    if isinstance(git, str) and len(git) <= _MAX_LEN:
        m = _GIT_VERSION.fullmatch(git.strip())
        if m:
            return int(m.group(1)), int(m.group(2))
    major, minor = version_doc.get("major"), version_doc.get("minor")
    if isinstance(major, str) and isinstance(minor, str):
        ma, mi = _MINOR.fullmatch(major.strip()), _MINOR.fullmatch(minor.strip())
        if ma and mi:
            return int(ma.group(1)), int(mi.group(1))
    return None


def served_group_versions(api_versions: Mapping[str, Any] | None,
                          api_group_list: Mapping[str, Any] | None) -> frozenset[str]:
    """Every ``group/version`` in an ``/api`` document (``APIVersions``: ``versions``, the
    core group's, kept as ``v1``) and an ``/apis`` document (``APIGroupList``: ``groups[]``
    with ``versions[].groupVersion``). Malformed entries are skipped."""
    out: set[str] = set()
    if isinstance(api_versions, Mapping):
        out.update(v for v in _list(api_versions.get("versions")) if isinstance(v, str))
    if isinstance(api_group_list, Mapping):
        for group in _list(api_group_list.get("groups")):
            if isinstance(group, Mapping):
                for v in _list(group.get("versions")):
                    gv = v.get("groupVersion") if isinstance(v, Mapping) else None
                    if isinstance(gv, str) and len(gv) <= _MAX_LEN:
                        out.add(gv)
    return frozenset(out)


def facts_from(version_doc: Mapping[str, Any] | None, api_versions: Mapping[str, Any] | None,
               api_group_list: Mapping[str, Any] | None) -> ClusterFacts:
    """:class:`ClusterFacts` from the three discovery documents (None: not read)."""
    doc = version_doc if isinstance(version_doc, Mapping) else {}
    git = doc.get("gitVersion")
    git = git.strip()[:_MAX_LEN] if isinstance(git, str) else ""
    return ClusterFacts(git, parse_release(doc),
                        served_group_versions(api_versions, api_group_list))


def binding_copies_labels(facts: ClusterFacts) -> bool:
    """Whether the server copies a Binding's labels onto the pod: 1.35 or later (see the
    module doc). An unknown version counts as older (the label patch is then written:
    harmless)."""
    return facts.release is not None and facts.release >= (1, BINDING_LABELS_MINOR)


def dra_refusal(facts: ClusterFacts) -> str | None:
    """One line saying why DRA mode cannot run on this server, or None when it can
    (``resource.k8s.io/v1`` served)."""
    if facts.serves(DRA_GROUP_VERSION):
        return None
    return (f"DRA mode needs the API {DRA_GROUP_VERSION} (Kubernetes 1.34 or later; 1.36 or "
            f"later for consumable capacity by default); the API server ({facts.shown}) "
            "does not serve it: run hami in extender mode (dra.enabled=false)")


def needs_capacity_check(facts: ClusterFacts) -> bool:
    """Whether consumable capacity may be off on this server (before 1.36, or an unknown
    version), so the DRA plugin checks it (:func:`capacity_refusal`)."""
    return facts.release is None or facts.release < (1, CONSUMABLE_CAPACITY_DEFAULT_MINOR)


#: Fields of a ResourceSlice device DRA mode writes => the feature gate an API server
#: must have on to keep them (it drops a disabled feature's fields on create).
DEVICE_FEATURES = (("allowMultipleAllocations", "DRAConsumableCapacity",
                    "on by default from Kubernetes 1.36"),
                   ("taints", "DRADeviceTaints", "cordoned and unhealthy cards are marked by it"),
                   ("consumesCounters", "DRAPartitionableDevices",
                    "MIG-mode cards are published as partitionable devices"))


def capacity_refusal(facts: ClusterFacts, sent_device: Mapping[str, Any],
                     returned_device: Mapping[str, Any] | None) -> str | None:
    """Compare a device sent in a dry-run ResourceSlice create with the one the server
    returned: a server without ``DRAConsumableCapacity`` drops the device's
    ``allowMultipleAllocations`` (v1.35.4 did), one without ``DRADeviceTaints`` its
    ``taints`` (v1.35.4 did), as an API server drops a disabled feature's fields. One line
    naming the gates when it dropped any, else None (:func:`slice_refusal` of one)."""
    return slice_refusal(facts, [sent_device], [returned_device])


def slice_refusal(facts: ClusterFacts, sent_devices: Sequence[Mapping[str, Any]],
                  returned_devices: Sequence[Any]) -> str | None:
    """:func:`capacity_refusal` for every device of a dry-run ResourceSlice: each sent
    device is looked up by ``name`` among the returned ones (``spec.devices[]``) and the
    :data:`DEVICE_FEATURES` fields it carried and lost name their gates
    (``consumesCounters``: ``DRAPartitionableDevices``, lost on v1.35.4). One line naming
    every gate missing, or saying a device came back missing; None when all kept."""
    returned = {d.get("name"): d for d in returned_devices if isinstance(d, Mapping)}
    missing: list[tuple[str, str]] = []
    for sent in sent_devices:
        got = returned.get(sent.get("name"))
        if got is None:
            return (f"the API server ({facts.shown}) returned no device {sent.get('name')!r} "
                    "for a dry-run ResourceSlice; cannot tell whether the DRA features "
                    "DRA mode needs are on")
        missing += [(gate, why) for field_, gate, why in DEVICE_FEATURES
                    if sent.get(field_) and not got.get(field_)
                    and (gate, why) not in missing]
    if not missing:
        return None
    gates = ", ".join(f"{gate} ({why})" for gate, why in missing)
    return (f"DRA mode needs the feature gates {gates}; the API server ({facts.shown}) drops "
            "their fields: enable them on kube-apiserver, kube-scheduler, "
            "kube-controller-manager and kubelet, or run hami in extender mode "
            "(dra.enabled=false)")


def needs_prioritized_list_check(facts: ClusterFacts) -> bool:
    """Whether prioritized lists may be off on this server (before 1.37, where
    ``DRAPrioritizedList`` can be turned off, or an unknown version)."""
    return facts.release is None or facts.release < (1, PRIORITIZED_LIST_LOCKED_MINOR)


def prioritized_list_refusal(facts: ClusterFacts, sent_request: Mapping[str, Any],
                             returned_request: Mapping[str, Any] | None,
                             rejected: str = "") -> str | None:
    """Whether a server kept the ``firstAvailable`` of a request in a dry-run
    ResourceClaimTemplate: one without ``DRAPrioritizedList`` drops it, and then refuses
    the request as having neither ``exactly`` nor ``firstAvailable`` (``rejected``: the
    server's 422 message) or returns it without. One line naming the gate, else None."""
    if not sent_request.get("firstAvailable"):
        return None
    if not rejected and isinstance(returned_request, Mapping) and returned_request.get(
            "firstAvailable"):
        return None
    said = f" (it answered: {rejected[:200]})" if rejected else ""
    return (f"DRA mode needs the feature gate DRAPrioritizedList (the webhook asks MIG "
            f"instances first, then the shared card, in one prioritized list); the API "
            f"server ({facts.shown}) drops firstAvailable{said}: enable it on "
            "kube-apiserver, kube-scheduler and kube-controller-manager, or run hami in "
            "extender mode (dra.enabled=false)")


def scheduler_line(facts: ClusterFacts, dra_mode: bool) -> str:
    """The one line the scheduler logs at start-up about what it chose."""
    labels = ("the API server copies a Binding's labels" if binding_copies_labels(facts)
              else f"the API server drops a Binding's labels (before 1.{BINDING_LABELS_MINOR}): "
                   "hami.io/vgpu-node is written by a patch after the Binding")
    vap = ("ValidatingAdmissionPolicy v1 served" if facts.release is not None
           and facts.release >= (1, VAP_MINOR)
           else "no ValidatingAdmissionPolicy v1 (before 1.30): the chart leaves its policies out")
    mode = "DRA mode" if dra_mode else "extender mode"
    return f"Kubernetes {facts.shown}, {mode}: {labels}; {vap}"


def _list(value: Any) -> Iterable[Any]:
    return value if isinstance(value, list) else ()
