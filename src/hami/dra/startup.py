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
  (:func:`hami.core.clusterfacts.capacity_refusal`).
"""

from __future__ import annotations

import logging
from typing import Any

from hami.clusterprobe import ProbeError, read_facts
from hami.core.clusterfacts import (
    ClusterFacts,
    capacity_refusal,
    dra_refusal,
    needs_capacity_check,
)
from hami.core.model import DeviceInfo
from hami.dra import slices

log = logging.getLogger(__name__)

#: The card of the dry-run slice (never stored; its values only need to be valid).
PROBE_DEVICE = DeviceInfo(uuid="GPU-00000000-0000-0000-0000-000000000000", index=0,
                          split_count=2, memory_mib=1024, cores_percent=100,
                          type="NVIDIA-probe")


#: The ``k`` of the dry-run slice's name (a node has at most a few MIG slices).
PROBE_INDEX = 999999


def probe_slice(node: str) -> dict[str, Any]:
    """The dry-run ResourceSlice (``resource.k8s.io/v1`` as a dict) for ``node``, named
    apart from the node's real slices (a dry-run create of an existing name is refused)
    but inside the names the chart's admission policy lets this node's plugin write
    (``<node>-gpu.hami.io-mig-<k>``, with a ``k`` no node reaches)."""
    doc = slices.resource_slice(node, [PROBE_DEVICE], generation=1,
                                cordoned=frozenset({PROBE_DEVICE.uuid}))  # with a taint
    doc["metadata"]["name"] = f"{slices.slice_name(node)}-mig-{PROBE_INDEX}"
    return doc


def refusal(client: Any, node: str) -> str | None:
    """One line saying why DRA mode cannot run against ``client``'s API server, or None.
    Logs the server's version and what was found once."""
    try:
        facts = read_facts(client)
    except ProbeError as exc:
        return f"cannot read the API server's version and APIs: {exc}"
    reason = dra_refusal(facts) or _capacity(client, node, facts)
    if reason is None:
        log.info("Kubernetes %s serves resource.k8s.io/v1 with consumable capacity and "
                 "device taints: DRA mode", facts.shown)
    return reason


def _capacity(client: Any, node: str, facts: ClusterFacts) -> str | None:
    if not needs_capacity_check(facts):
        return None
    from lightkube import codecs

    doc = probe_slice(node)
    try:
        got = client.create(codecs.from_dict(doc), dry_run=True).to_dict()
    except Exception as exc:  # noqa: BLE001 - the API's answer, in one line
        return (f"the API server ({facts.shown}) refused a dry-run ResourceSlice, so DRA "
                f"mode cannot publish this node's cards: {str(exc)[:300]}")
    devices = (got.get("spec") or {}).get("devices") or [None]
    return capacity_refusal(facts, doc["spec"]["devices"][0], devices[0])
