"""hami.core.clusterfacts: the start-up decisions from an API server's discovery documents."""

from __future__ import annotations

from typing import Any

import pytest

from hami.core.clusterfacts import (
    binding_copies_labels,
    capacity_refusal,
    dra_refusal,
    facts_from,
    needs_capacity_check,
    needs_prioritized_list_check,
    parse_release,
    prioritized_list_refusal,
    scheduler_line,
    slice_refusal,
)

API = {"kind": "APIVersions", "versions": ["v1"]}


def _groups(*group_versions: str) -> dict[str, Any]:
    return {"kind": "APIGroupList", "groups": [
        {"name": gv.split("/")[0], "versions": [{"groupVersion": gv}]} for gv in group_versions]}


@pytest.mark.parametrize(("doc", "release"), [
    ({"gitVersion": "v1.31.14", "major": "1", "minor": "31"}, (1, 31)),
    ({"gitVersion": "v1.30.2-eks-1a2b3c"}, (1, 30)),
    ({"gitVersion": "garbage", "major": "1", "minor": "29+"}, (1, 29)),
    ({"major": "1", "minor": "x"}, None),
    ({"gitVersion": 7}, None),
    ({"gitVersion": "v1." + "9" * 500 + ".0"}, None),
    ({}, None),
])
def test_parse_release(doc: dict[str, Any], release: tuple[int, int] | None) -> None:
    assert parse_release(doc) == release


def test_served_versions_from_both_documents_and_garbage_skipped() -> None:
    groups = _groups("resource.k8s.io/v1", "apps/v1")
    groups["groups"].append({"name": "x", "versions": [7, {"groupVersion": None}]})
    groups["groups"].append("not a group")
    facts = facts_from({"gitVersion": "v1.37.2"}, API, groups)
    assert facts.served == {"v1", "resource.k8s.io/v1", "apps/v1"}
    assert facts.serves("resource.k8s.io/v1") and not facts.serves("resource.k8s.io/v1beta1")
    assert facts_from(None, None, None).served == frozenset()
    assert facts_from(None, None, None).shown == "an unknown version"


@pytest.mark.parametrize(("version", "copies"), [
    ("v1.31.14", False), ("v1.33.13", False), ("v1.34.4", False), ("v1.35.4", True),
    ("v1.37.2", True),
    ("nonsense", False),  # unknown: write the label (harmless where it was copied)
])
def test_binding_labels_from_1_35(version: str, copies: bool) -> None:
    assert binding_copies_labels(facts_from({"gitVersion": version}, API, None)) is copies


def test_dra_refused_without_resource_v1_in_one_line() -> None:
    old = facts_from({"gitVersion": "v1.33.13"}, API, _groups("resource.k8s.io/v1beta2"))
    reason = dra_refusal(old)
    assert reason and "\n" not in reason
    assert "resource.k8s.io/v1" in reason and "v1.33.13" in reason and "dra.enabled=false" in reason
    new = facts_from({"gitVersion": "v1.34.4"}, API, _groups("resource.k8s.io/v1"))
    assert dra_refusal(new) is None


@pytest.mark.parametrize(("version", "check"), [
    ("v1.34.4", True), ("v1.35.4", True), ("v1.36.3", False), ("v1.37.2", False), ("x", True),
])
def test_capacity_checked_before_1_36(version: str, check: bool) -> None:
    assert needs_capacity_check(facts_from({"gitVersion": version}, API, None)) is check


def test_capacity_refusal_when_the_server_drops_the_field() -> None:
    facts = facts_from({"gitVersion": "v1.34.4"}, API, _groups("resource.k8s.io/v1"))
    sent = {"name": "gpu-0", "allowMultipleAllocations": True,
            "taints": [{"key": "k", "effect": "NoSchedule"}]}
    assert capacity_refusal(facts, sent, dict(sent)) is None
    reason = capacity_refusal(facts, sent, {"name": "gpu-0"})  # what v1.35.4 returned
    assert reason and "\n" not in reason
    assert "DRAConsumableCapacity" in reason and "DRADeviceTaints" in reason
    only_taints = capacity_refusal(facts, sent, {**sent, "taints": None})
    assert only_taints and "DRADeviceTaints" in only_taints
    assert "DRAConsumableCapacity" not in only_taints
    assert capacity_refusal(facts, sent, None)


@pytest.mark.parametrize(("version", "prioritized"), [
    ("v1.34.4", True), ("v1.35.4", True), ("v1.36.3", True), ("v1.37.2", False), ("x", True),
])
def test_prioritized_lists_checked_before_1_37(version: str, prioritized: bool) -> None:
    facts = facts_from({"gitVersion": version}, API, None)
    assert needs_prioritized_list_check(facts) is prioritized


MIG_DEVICE = {"name": "gpu-0-1g-10gb-0", "taints": [{"key": "k", "effect": "NoSchedule"}],
              "consumesCounters": [{"counterSet": "gpu-0-slices",
                                    "counters": {"memory-slice-0": {"value": "1"}}}]}
CARD = {"name": "gpu-0", "allowMultipleAllocations": True,
        "taints": [{"key": "k", "effect": "NoSchedule"}]}


def test_slice_refusal_names_partitionable_devices_when_counters_are_dropped() -> None:
    facts = facts_from({"gitVersion": "v1.35.4"}, API, _groups("resource.k8s.io/v1"))
    assert slice_refusal(facts, [CARD, MIG_DEVICE], [dict(MIG_DEVICE), dict(CARD)]) is None
    without = {k: v for k, v in MIG_DEVICE.items() if k != "consumesCounters"}
    reason = slice_refusal(facts, [CARD, MIG_DEVICE], [dict(CARD), without])
    assert reason and "\n" not in reason and "v1.35.4" in reason
    assert "DRAPartitionableDevices" in reason and "DRAConsumableCapacity" not in reason
    # what v1.35.4 with its default gates returns: every gate named once
    everything = slice_refusal(facts, [CARD, MIG_DEVICE],
                               [{"name": "gpu-0"}, {"name": MIG_DEVICE["name"]}])
    assert everything and everything.count("DRADeviceTaints") == 1
    assert "DRAConsumableCapacity" in everything and "DRAPartitionableDevices" in everything
    lost = slice_refusal(facts, [CARD, MIG_DEVICE], [dict(CARD), "garbage"])
    assert lost and MIG_DEVICE["name"] in lost


FIRST = {"name": "gpu", "firstAvailable": [{"name": "mig-1g-10gb"}, {"name": "shared"}]}


def test_prioritized_list_refusal_names_the_gate() -> None:
    facts = facts_from({"gitVersion": "v1.35.4"}, API, _groups("resource.k8s.io/v1"))
    assert prioritized_list_refusal(facts, FIRST, dict(FIRST)) is None
    dropped = prioritized_list_refusal(facts, FIRST, {"name": "gpu"})
    assert dropped and "DRAPrioritizedList" in dropped and "\n" not in dropped
    said = "spec.spec.devices.requests[0]: Required value: exactly one of `exactly` or " \
           "`firstAvailable` is required"
    rejected = prioritized_list_refusal(facts, FIRST, None, rejected=said)
    assert rejected and "DRAPrioritizedList" in rejected and "exactly one of" in rejected
    assert prioritized_list_refusal(facts, {"name": "gpu", "exactly": {}}, None) is None


def test_scheduler_line_says_what_was_chosen() -> None:
    old = scheduler_line(facts_from({"gitVersion": "v1.29.6"}, API, None), dra_mode=False)
    assert "v1.29.6" in old and "written by a patch" in old and "leaves its policies out" in old
    new = scheduler_line(facts_from({"gitVersion": "v1.37.2"}, API, None), dra_mode=True)
    assert "copies a Binding's labels" in new and "DRA mode" in new
