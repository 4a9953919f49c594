"""``hami dra-plugin`` at start-up: does the API server offer what DRA mode needs?

Reads ``/version`` and the served APIs once (:mod:`hami.clusterprobe`), logs one line,
and returns a one-line refusal (the command prints it and exits 1) where DRA mode cannot
work, so the plugin never fails late at its first ResourceSlice or claim:

* no ``resource.k8s.io/v1`` (Kubernetes before 1.34, or the API turned off):
  :func:`hami.core.clusterfacts.dra_refusal`;
* before 1.36, where consumable capacity is off by default: a dry-run create
  (``dryRun=All``: validated, never stored) of a ResourceSlice with one device of the
  shape :func:`hami.dra.slices.slice_device` publishes, cordoned (with a taint); a server
  whose ``DRAConsumableCapacity`` or ``DRADeviceTaints`` gate is off drops
  ``allowMultipleAllocations`` or ``taints`` from it
  (:func:`hami.core.clusterfacts.capacity_refusal`);
* on a node in ``mig`` mode, on every release (``DRAPartitionableDevices``: off by
  default before 1.36, beta and so still switchable in v1.37.2): the same dry-run slice
  carries one MIG instance device of the shape :func:`hami.dra.migslices.instance_device`
  publishes; a server without the gate drops its ``consumesCounters``
  (:func:`hami.core.clusterfacts.slice_refusal`).

:func:`template_refusal` is the scheduler's check in DRA mode: before 1.37 a dry-run
ResourceClaimTemplate with a prioritized list (``firstAvailable``, what the webhook
writes for MIG) tells whether ``DRAPrioritizedList`` is on.
"""

from __future__ import annotations

import logging
from typing import Any

from hami.clusterprobe import ProbeError, read_facts
from hami.core.clusterfacts import (
    ClusterFacts,
    dra_refusal,
    needs_capacity_check,
    needs_prioritized_list_check,
    prioritized_list_refusal,
    slice_refusal,
)
from hami.core.model import DeviceInfo, MigPlacement, MigProfile
from hami.dra import migslices, slices

log = logging.getLogger(__name__)

#: The card of the dry-run slice (never stored; its values only need to be valid).
PROBE_DEVICE = DeviceInfo(uuid="GPU-00000000-0000-0000-0000-000000000000", index=0,
                          split_count=2, memory_mib=1024, cores_percent=100,
                          type="NVIDIA-probe")


#: The MIG instance of the dry-run slice on a node in ``mig`` mode (``1g.10gb`` at slice 0
#: of that card; it consumes counters of a counter set the slice does not hold, as the
#: instances of real MIG cards do, :func:`hami.dra.slices.resource_slices`).
PROBE_MIG_PROFILE = MigProfile(name="1g.10gb", memory_mib=9856, cores_percent=14,
                               slice_count=1, placements=(MigPlacement(0, 1),))


#: The ``k`` of the dry-run slice's name (a node has at most a few MIG slices).
PROBE_INDEX = 999999


def probe_slice(node: str, mig: bool = False) -> dict[str, Any]:
    """The dry-run ResourceSlice (``resource.k8s.io/v1`` as a dict) for ``node``, named
    apart from the node's real slices (a dry-run create of an existing name is refused)
    but inside the names the chart's admission policy lets this node's plugin write
    (``<node>-gpu.hami.io-mig-<k>``, with a ``k`` no node reaches). ``mig``: a MIG
    instance device (:data:`PROBE_MIG_PROFILE`, cordoned) follows the shared card."""
    doc = slices.resource_slice(node, [PROBE_DEVICE], generation=1,
                                cordoned=frozenset({PROBE_DEVICE.uuid}))  # with a taint
    doc["metadata"]["name"] = f"{slices.slice_name(node)}-mig-{PROBE_INDEX}"
    if mig:
        doc["spec"]["devices"].append(migslices.instance_device(
            PROBE_DEVICE, PROBE_MIG_PROFILE, PROBE_MIG_PROFILE.placements[0], "cordoned"))
    return doc


def refusal(client: Any, node: str, mig: bool = False) -> str | None:
    """One line saying why DRA mode cannot run against ``client``'s API server, or None.
    ``mig``: this node's cards are in ``mig`` mode (partitionable devices checked too).
    Logs the server's version and what was found once."""
    try:
        facts = read_facts(client)
    except ProbeError as exc:
        return f"cannot read the API server's version and APIs: {exc}"
    reason = dra_refusal(facts) or _capacity(client, node, facts, mig)
    if reason is None:
        log.info("Kubernetes %s serves resource.k8s.io/v1 with consumable capacity and "
                 "device taints%s: DRA mode", facts.shown,
                 " and partitionable devices (MIG)" if mig else "")
    return reason


def _capacity(client: Any, node: str, facts: ClusterFacts, mig: bool) -> str | None:
    if not (mig or needs_capacity_check(facts)):
        return None
    from lightkube import codecs

    doc = probe_slice(node, mig)
    try:
        got = client.create(codecs.from_dict(doc), dry_run=True).to_dict()
    except Exception as exc:  # noqa: BLE001 - the API's answer, in one line
        return (f"the API server ({facts.shown}) refused a dry-run ResourceSlice, so DRA "
                f"mode cannot publish this node's cards: {str(exc)[:300]}")
    return slice_refusal(facts, doc["spec"]["devices"],
                         (got.get("spec") or {}).get("devices") or [])


#: The name prefix of the scheduler's dry-run ResourceClaimTemplate (generateName).
PROBE_TEMPLATE_PREFIX = "hami-probe-"


def probe_template(namespace: str) -> dict[str, Any]:
    """The scheduler's dry-run ResourceClaimTemplate in ``namespace``: one request as
    the webhook writes it for a MIG-capable ``nvidia.com/gpumem`` (a prioritized list:
    one MIG profile, then the shared card; :func:`hami.dra.translate.claim_spec`)."""
    from hami.dra.translate import TEMPLATE_LABEL, claim_spec

    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"generateName": PROBE_TEMPLATE_PREFIX, "namespace": namespace,
                         "labels": {TEMPLATE_LABEL: "true"}},
            "spec": {"spec": claim_spec(1, 1024, 10, [], [PROBE_MIG_PROFILE.name])}}


async def template_refusal(client: Any, facts: ClusterFacts, namespace: str) -> str | None:
    """The scheduler's DRA-mode check: one line naming ``DRAPrioritizedList`` where the
    server (before 1.37) drops ``firstAvailable`` from a dry-run ResourceClaimTemplate
    (:func:`probe_template`) or refuses it for that, a line with the server's answer where
    it refuses the template otherwise, else None. ``client``: a lightkube
    ``AsyncClient``."""
    if not needs_prioritized_list_check(facts):
        return None
    from lightkube import ApiError, codecs

    doc = probe_template(namespace)
    sent = doc["spec"]["spec"]["devices"]["requests"][0]
    try:
        got = (await client.create(codecs.from_dict(doc), dry_run=True)).to_dict()
    except ApiError as exc:
        message = str(getattr(exc.status, "message", "") or exc)
        if exc.status.code == 422 and ("firstAvailable" in message or "exactly" in message):
            return prioritized_list_refusal(facts, sent, None, rejected=message)
        return _template_refused(facts, message)
    except Exception as exc:  # noqa: BLE001 - the API's answer, in one line
        return _template_refused(facts, str(exc))
    spec = (got.get("spec") or {}).get("spec") or {}
    requests = (spec.get("devices") or {}).get("requests")
    returned = requests[0] if isinstance(requests, list) and requests else None
    return prioritized_list_refusal(facts, sent, returned)


def _template_refused(facts: ClusterFacts, message: str) -> str:
    return (f"the API server ({facts.shown}) refused a dry-run ResourceClaimTemplate, so "
            f"DRA mode cannot turn pods into claims: {' '.join(message.split())[:300]}")
