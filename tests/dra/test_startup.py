"""hami.dra.startup: the dry-run ResourceSlice the DRA plugin sends before 1.36 and the
dry-run ResourceClaimTemplate the scheduler sends in DRA mode."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx2 as httpx

from hami.core.clusterfacts import facts_from
from hami.dra import slices
from hami.dra.startup import PROBE_TEMPLATE_PREFIX, probe_slice, probe_template, template_refusal
from hami.dra.translate import SHARED_SUBREQUEST


def test_the_probe_slice_is_this_nodes_and_inside_the_chart_policy_names() -> None:
    doc = probe_slice("node-a")
    prefix = slices.slice_name("node-a")
    name = doc["metadata"]["name"]
    # the chart's DRA admission policy: <node>-gpu.hami.io or ...-(counters|mig)-<k>
    assert name != prefix and name.startswith(prefix + "-")
    assert re.fullmatch(r"(counters|mig)-[0-9]+", name[len(prefix) + 1:])
    spec = doc["spec"]
    assert spec["nodeName"] == "node-a" and spec["pool"]["name"] == "node-a"
    assert spec["driver"] == slices.DRIVER
    (device,) = spec["devices"]
    assert device["allowMultipleAllocations"] is True  # what a server without the gate drops
    assert device["taints"]  # likewise without DRADeviceTaints
    assert device["capacity"]


def test_the_mig_probe_slice_adds_an_instance_consuming_counters() -> None:
    doc = probe_slice("node-a", mig=True)
    card, instance = doc["spec"]["devices"]
    assert card == probe_slice("node-a")["spec"]["devices"][0]
    assert instance["consumesCounters"][0]["counters"]  # what a server without the gate drops
    assert instance["taints"] and "allowMultipleAllocations" not in instance
    assert "sharedCounters" not in doc["spec"]  # a slice holds devices or counters, never both


class _Templates:
    """A lightkube AsyncClient's ``create`` as the API server answers a dry-run
    ResourceClaimTemplate: ``keep`` False drops ``firstAvailable`` (DRAPrioritizedList
    off); ``status`` answers with that HTTP error instead."""

    def __init__(self, keep: bool = True, status: int = 0, message: str = "") -> None:
        self.keep, self.status, self.message = keep, status, message
        self.sent: list[tuple[Any, bool]] = []

    async def create(self, obj: Any, dry_run: bool = False) -> Any:
        from lightkube import ApiError, codecs

        self.sent.append((obj, dry_run))
        if self.status:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": self.message, "code": self.status}
            raise ApiError(response=httpx.Response(
                self.status, json=body, request=httpx.Request("POST", "https://k/x")))
        doc = obj.to_dict()
        if not self.keep:
            for req in doc["spec"]["spec"]["devices"]["requests"]:
                req.pop("firstAvailable", None)
        doc["metadata"]["name"] = doc["metadata"]["generateName"] + "x1y2z"
        return codecs.from_dict(doc)


FACTS_135 = facts_from({"gitVersion": "v1.35.4"}, {"versions": ["v1"]}, None)


def _refusal(client: _Templates, facts: Any = FACTS_135) -> str | None:
    return asyncio.run(template_refusal(client, facts, "hami-system"))


def test_the_probe_template_is_a_prioritized_list_in_the_schedulers_namespace() -> None:
    doc = probe_template("hami-system")
    assert doc["metadata"]["namespace"] == "hami-system"
    assert doc["metadata"]["generateName"] == PROBE_TEMPLATE_PREFIX  # never an existing name
    (request,) = doc["spec"]["spec"]["devices"]["requests"]
    assert [s["name"] for s in request["firstAvailable"]][-1] == SHARED_SUBREQUEST


def test_template_refusal_names_prioritized_lists_when_dropped_or_refused() -> None:
    kept = _Templates()
    assert _refusal(kept) is None
    (obj, dry_run), = kept.sent
    assert dry_run is True and obj.metadata.namespace == "hami-system"
    dropped = _refusal(_Templates(keep=False))
    assert dropped and "DRAPrioritizedList" in dropped and "\n" not in dropped
    said = ("ResourceClaimTemplate.resource.k8s.io \"hami-probe-x\" is invalid: "
            "spec.spec.devices.requests[0]: Required value: exactly one of `exactly` or "
            "`firstAvailable` is required")
    rejected = _refusal(_Templates(status=422, message=said))
    assert rejected and "DRAPrioritizedList" in rejected and "exactly one of" in rejected


def test_template_refusal_other_answers_are_one_line_without_the_gate() -> None:
    forbidden = _refusal(_Templates(status=403, message="templates is forbidden:\nno"))
    assert forbidden and "forbidden" in forbidden and "\n" not in forbidden
    assert "DRAPrioritizedList" not in forbidden


def test_template_refusal_is_not_asked_where_prioritized_lists_are_locked_on() -> None:
    never = _Templates(keep=False)
    assert _refusal(never, facts_from({"gitVersion": "v1.37.2"}, {"versions": ["v1"]},
                                      None)) is None
    assert never.sent == []
