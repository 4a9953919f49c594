"""``hami top``'s view of a known cluster state (pure: no cluster needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hami.top import cluster_view, narrow
from hami.toptable import render_table
from tests.deploy.top_cluster import EXPECTED, node, objects, register


def test_view_of_known_state() -> None:
    nodes, pods, quotas = objects()
    view = cluster_view(nodes, pods, quotas)
    assert json.loads(json.dumps(view)) == EXPECTED


def test_view_is_independent_of_listing_order() -> None:
    nodes, pods, quotas = objects()
    view = cluster_view(reversed(nodes), list(reversed(pods)), quotas)
    assert json.loads(json.dumps(view)) == EXPECTED


def test_table_shows_nodes_gpus_pods_and_problems() -> None:
    text = render_table(cluster_view(*objects()), width=220)
    lines = text.splitlines()
    row = next(line for line in lines if "GPU-top-a-0" in line)
    for cell in ("6000/16384 (37%)", "30/100 (30%)", "2/10", "team-a/infer-1(2000,0,unsigned)",
                 "team-a/train-0(4000,30)"):
        assert cell in row, (cell, row)
    assert "cordoned" in next(line for line in lines if "GPU-top-b-2" in line)
    assert "unhealthy" in next(line for line in lines if "GPU-top-b-3" in line)
    node_row = next(line for line in lines if line.lstrip("│ ").startswith("top-a"))
    assert "10000/32768 (30%)" in node_row and "2026-01-01T00:00:00Z,team-a,train-0" in node_row
    assert "no gpu found on node" in text and "phase Succeeded" in text
    assert "10000/20000" in text  # team-a quota
    assert "signing: 3 signed, 1 unsigned allocation(s)" in text
    assert "team-a/infer-1" in next(line for line in lines if line.startswith("signing:"))


def test_signing_says_when_no_unsigned_allocation_is_left() -> None:
    """Issue 28: a migration from HAMi waits until no pod HAMi placed (unsigned) is left
    before strict signing is switched on; hami top names them, then says none is left.
    A pod that ended (Succeeded) no longer counts."""
    nodes, pods, quotas = objects()
    infer = next(p for p in pods if p["metadata"]["name"] == "infer-1")
    text = render_table(cluster_view(nodes, pods, quotas), width=220)
    assert "1 unsigned allocation(s)" in text
    infer["status"]["phase"] = "Succeeded"
    view = cluster_view(nodes, pods, quotas)
    assert view["signing"] == {"signed": 3, "unsigned": []}
    assert "no unsigned allocation left" in render_table(view, width=220)
    # a forged or HAMi-written pod of another namespace still shows under -n of its own
    infer["status"]["phase"] = "Running"
    view = narrow(cluster_view(nodes, pods, quotas), "team-b", None, [])
    assert view["signing"] == {"signed": 2, "unsigned": []}
    view = narrow(cluster_view(nodes, pods, quotas), "team-a", None, [])
    assert view["signing"]["unsigned"] == [{"namespace": "team-a", "name": "infer-1",
                                            "node": "top-a"}]


def _slice(node: str, cards: int, *, mem_mib: int = 16384, taint: str = "") -> dict[str, Any]:
    from hami.core.model import DeviceInfo
    from hami.dra.slices import resource_slice

    devs = [DeviceInfo(uuid=f"GPU-{node}-{i}", index=i, split_count=10, memory_mib=mem_mib,
                       cores_percent=100, type="NVIDIA-Tesla T4")
            for i in range(cards)]
    return resource_slice(node, devs, cordoned=frozenset(
        {f"GPU-{node}-1"} if taint == "cordoned" else set()))


def _claim(ns: str, name: str, results: list[tuple[str, str, int, int]],
           pods: tuple[str, ...] = (), driver: str = "gpu.hami.io") -> dict[str, Any]:
    """``results``: (node, device, memory MiB, cores) consumed."""
    status: dict[str, Any] = {}
    if results:
        status["allocation"] = {"devices": {"results": [
            {"request": "gpu", "driver": driver, "pool": node, "device": dev,
             "shareID": f"s{k}", "consumedCapacity": {
                 "memory": f"{mem}Mi", "cores": str(cores), "shares": "1"}}
            for k, (node, dev, mem, cores) in enumerate(results)]}}
    if pods:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"u-{p}"} for p in pods]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": ns, "name": name}, "spec": {}, "status": status}


def test_dra_claims_show_per_card() -> None:
    """Issue 18: `hami top` read node and pod annotations only, so DRA allocations (in the
    ResourceClaims' status) were invisible. Each card of a DRA node now sums the
    consumedCapacity of the claims allocated on it and lists them with their pods."""
    nodes, pods, quotas = objects()
    slices = [_slice("dra-a", 2), _slice("dra-b", 2, mem_mib=40960, taint="cordoned"),
              {"spec": {"driver": "other.example.com", "nodeName": "x", "devices": []}}]
    claims = [
        _claim("team-a", "infer-gpu-0-abc", [("dra-a", "gpu-0", 3000, 20)], ("infer",)),
        _claim("team-b", "train-gpu-0-def", [("dra-a", "gpu-0", 5000, 30),
                                             ("dra-a", "gpu-1", 5000, 30)], ("train",)),
        _claim("team-b", "shared", [("dra-b", "gpu-0", 40960, 0)], ("p1", "p2")),
        _claim("team-b", "waiting", [("dra-b", "gpu-0", 1000, 0)]),  # not reserved yet
        _claim("team-b", "pending", []),                              # not allocated
        _claim("team-c", "foreign", [("dra-a", "gpu-0", 9999, 99)], ("x",),
               driver="other.example.com"),
        _claim("team-c", "gone", [("dra-a", "gpu-7", 1234, 1)], ("y",)),  # no such card
    ]
    view = cluster_view(nodes, pods, quotas, slices=slices, claims=claims)
    by_name = {n["name"]: n for n in view["nodes"]}
    assert [n["name"] for n in view["nodes"]] == sorted(by_name)
    assert "top-a" in by_name  # extender-mode nodes stay
    a = by_name["dra-a"]
    assert a["mode"] == "dra" and a["gpus"] == 2 and a["pods"] == 2
    assert a["memory_mib"] == {"used": 13000, "total": 32768}
    assert a["cores"] == {"used": 80, "total": 200} and a["tasks"] == {"used": 3, "total": 20}
    g0 = a["devices"][0]
    assert (g0["uuid"], g0["index"], g0["mode"], g0["type"]) == (
        "GPU-dra-a-0", 0, "dra", "NVIDIA-Tesla T4")
    assert g0["memory_mib"] == {"used": 8000, "total": 16384}
    assert g0["pods"] == [
        {"namespace": "team-a", "name": "infer", "claim": "infer-gpu-0-abc",
         "memory_mib": 3000, "cores": 20, "slots": 1},
        {"namespace": "team-b", "name": "train", "claim": "train-gpu-0-def",
         "memory_mib": 5000, "cores": 30, "slots": 1}]
    b = by_name["dra-b"]
    assert b["devices"][0]["memory_mib"]["used"] == 41960
    assert [p["name"] for p in b["devices"][0]["pods"]] == ["p1,p2", "waiting"]
    assert b["devices"][1]["cordoned"] and b["devices"][1]["health"]
    assert b["pods"] == 2 and "x" not in {n["name"] for n in view["nodes"]}
    # -n narrows the pods listed, not the usage
    narrowed = narrow(json.loads(json.dumps(view)), "team-a", ["dra-a"], ["dra-a"])
    (only,) = narrowed["nodes"]
    assert [p["name"] for p in only["devices"][0]["pods"]] == ["infer"]
    assert only["devices"][0]["memory_mib"]["used"] == 8000
    text = render_table(view, width=220)
    row = next(line for line in text.splitlines() if "GPU-dra-a-0" in line)
    for cell in ("8000/16384 (49%)", "50/100 (50%)", "2/10", "ok,dra",
                 "team-a/infer(3000,20)", "team-b/train(5000,30)"):
        assert cell in row, (cell, row)
    assert "cordoned,dra" in next(line for line in text.splitlines() if "GPU-dra-b-1" in line)


def test_dra_mig_card_listed_once_with_its_instances() -> None:
    """A MIG-mode card is published as one device per instance it may host (13 for an
    A100 with four profiles); `hami top` showed each as its own card. It is one card,
    the instances allocated on it listed under it with their profile and memory."""
    from hami.core.model import DeviceInfo, MigPlacement, MigProfile
    from hami.dra import migslices
    from hami.dra.slices import resource_slice

    a100 = DeviceInfo(uuid="GPU-m", index=0, split_count=7, memory_mib=40960,
                      cores_percent=100, type="NVIDIA-A100", mode="mig", mig_profiles=(
                          MigProfile("1g.5gb", 4864, 14, 1,
                                     tuple(MigPlacement(k, 1) for k in range(7))),
                          MigProfile("3g.20gb", 19968, 42, 3,
                                     (MigPlacement(0, 4), MigPlacement(4, 4)))))
    doc = resource_slice("dra-m", ())
    doc["spec"]["devices"] = migslices.instance_devices(a100)
    claims = [{"metadata": {"namespace": "t", "name": f"c{k}"}, "status": {
        "reservedFor": [{"resource": "pods", "name": f"p{k}", "uid": f"u{k}"}],
        "allocation": {"devices": {"results": [
            {"request": "gpu/mig", "driver": "gpu.hami.io", "pool": "dra-m", "device": dev}]}}}}
        for k, dev in enumerate(["gpu-0-3g-20gb-4", "gpu-0-1g-5gb-0"])]
    nodes, pods, quotas = objects()
    view = cluster_view(nodes, pods, quotas, slices=[doc], claims=claims)
    (m,) = [n for n in view["nodes"] if n["name"] == "dra-m"]
    assert m["gpus"] == 1 and m["pods"] == 2
    (card,) = m["devices"]
    assert (card["uuid"], card["mode"], card["instances"]) == ("GPU-m", "dra-mig", 9)
    # the total: the most one profile's instances hold (2 x 19968 > 7 x 4864)
    assert card["memory_mib"] == {"used": 19968 + 4864, "total": 2 * 19968}
    assert card["tasks"] == {"used": 2, "total": 7}
    assert [(p["name"], p["profile"], p["instance"], p["memory_mib"]) for p in card["pods"]] == [
        ("p0", "3g.20gb", "gpu-0-3g-20gb-4", 19968), ("p1", "1g.5gb", "gpu-0-1g-5gb-0", 4864)]
    text = render_table(view, width=220)
    (row,) = [line for line in text.splitlines() if "GPU-m" in line]
    assert "t/p0[3g.20gb](19968,0)" in row and "ok,dra-mig" in row


def test_pods_of_another_scheduler_are_named_and_countable() -> None:
    """Beside HAMi (docs/install.md, path A) hami's pods carry hami-py-scheduler: hami top
    says why it does not count them and counts them with --scheduler-name."""
    from hami.devices.registry import make_config

    nodes, pods, quotas = objects()
    other = next(p for p in pods if p["metadata"]["name"] == "big")
    other["spec"]["schedulerName"] = "hami-py-scheduler"
    view = cluster_view(nodes, pods, quotas)
    assert {"namespace": "team-b", "name": "big", "node": "top-b",
            "reason": "schedulerName hami-py-scheduler: another scheduler's pod (hami top "
                      "--scheduler-name hami-py-scheduler counts it)"} in view["unplaced"]
    mine = cluster_view(nodes, [other], quotas, make_config(scheduler_name="hami-py-scheduler"))
    assert [p["name"] for n in mine["nodes"] for d in n["devices"] for p in d["pods"]] == ["big"]


def _signing_lines(nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
                   quotas: list[dict[str, Any]]) -> str:
    text = render_table(cluster_view(nodes, pods, quotas), width=400)
    return text[text.index("signing:"):].split("\nquotas")[0].strip()


def _trust(nodes: list[dict[str, Any]], name: str, value: Any) -> None:
    annotations = next(n for n in nodes if n["metadata"]["name"] == name)["metadata"][
        "annotations"]
    if value is None:
        annotations.pop("hami.io/node-trust-unsigned-allocations", None)
    else:
        annotations["hami.io/node-trust-unsigned-allocations"] = value


def test_signing_line_says_strict_signing_is_on_for_all_nodes() -> None:
    """Each device plugin writes its mode on its Node; with every node strict and none
    left unsigned the line says so, not "safe to switch on, if it is not on already"."""
    nodes, pods, quotas = objects()
    next(p for p in pods if p["metadata"]["name"] == "infer-1")["status"]["phase"] = "Succeeded"
    _trust(nodes, "top-b", "false")
    assert _signing_lines(nodes, pods, quotas) == (
        "signing: 3 signed allocation(s), no unsigned allocation left: strict signing is on "
        "for all nodes")
    view = cluster_view(nodes, pods, quotas)
    assert [(n["name"], n["strict_signing"]) for n in view["nodes"]] == [("top-a", "on"),
                                                                          ("top-b", "on")]


def test_signing_line_names_the_nodes_that_still_trust_unsigned_allocations() -> None:
    nodes, pods, quotas = objects()
    next(p for p in pods if p["metadata"]["name"] == "infer-1")["status"]["phase"] = "Succeeded"
    _trust(nodes, "top-b", "true")
    assert _signing_lines(nodes, pods, quotas) == (
        "signing: 3 signed allocation(s), no unsigned allocation left: 1 node (top-b) still "
        "trusts unsigned allocations; nothing unsigned is left, so strict signing is safe to "
        "switch on there (allocationSigning.trustUnsignedAllocations=false)")
    _trust(nodes, "top-a", "true")
    assert "2 nodes (top-a, top-b) still trust unsigned allocations; nothing unsigned" \
        in _signing_lines(nodes, pods, quotas)


def test_signing_line_for_mixed_nodes_and_the_table_column() -> None:
    """on (top-a), off (top-c), unknown (top-b: no annotation, an older plugin or HAMi's):
    the nodes table says it per node, the summary names the off and the unknown ones."""
    nodes, pods, quotas = objects()
    next(p for p in pods if p["metadata"]["name"] == "infer-1")["status"]["phase"] = "Succeeded"
    nodes.append(node("top-c", {"hami.io/node-nvidia-register": register("top-c", 1),
                                "hami.io/node-trust-unsigned-allocations": "true"}))
    text = render_table(cluster_view(nodes, pods, quotas), width=400)
    nodes_table = text[:text.index("\ngpus")]
    rows = {line.strip("│ ").split()[0]: line for line in nodes_table.splitlines()
            if line.lstrip("│ ").startswith("top-")}
    assert "STRICT SIGNING" in text
    for name, mode in (("top-a", " on "), ("top-b", " unknown "), ("top-c", " off ")):
        assert mode in rows[name], rows[name]
    assert _signing_lines(nodes, pods, quotas) == (
        "signing: 3 signed allocation(s), no unsigned allocation left: 1 node (top-c) still "
        "trusts unsigned allocations; nothing unsigned is left, so strict signing is safe to "
        "switch on there (allocationSigning.trustUnsignedAllocations=false); strict signing "
        "unknown on 1 node (top-b): the device plugin does not say (an older hami, or HAMi's)")
    # with an unsigned allocation left: never "safe to switch on", the modes still shown
    next(p for p in pods if p["metadata"]["name"] == "infer-1")["status"]["phase"] = "Running"
    tail = _signing_lines(nodes, pods, quotas)
    assert "can be switched on" not in tail and "safe to switch on" not in tail
    assert "a device plugin in strict mode refuses them" in tail
    assert tail.endswith("strict signing: on for 1 node; off on top-c (unsigned allocations "
                         "served); unknown on top-b"), tail


@pytest.mark.parametrize("value", ["", "TRUE", "False", "yes", "1", " false", "x" * 5000,
                                   "false\n", "ｆａｌｓｅ"])
def test_a_malformed_signing_mode_is_unknown(value: str) -> None:
    """The annotation is node metadata: anything but "true"/"false" is unknown, no crash."""
    nodes, pods, quotas = objects()
    _trust(nodes, "top-a", value)
    view = cluster_view(nodes, pods, quotas)
    assert next(n for n in view["nodes"] if n["name"] == "top-a")["strict_signing"] == "unknown"
    assert "unknown on top-a, top-b" in _signing_lines(nodes, pods, quotas)


@pytest.mark.parametrize("value", [None, 1, True, ["false"], {"a": "b"}])
def test_strict_signing_of_non_string_values_is_unknown(value: Any) -> None:
    from hami.top import strict_signing

    annotations = {} if value is None else {"hami.io/node-trust-unsigned-allocations": value}
    assert strict_signing(annotations) == "unknown"
    assert strict_signing({"hami.io/node-trust-unsigned-allocations": "false"}) == "on"
    assert strict_signing({"hami.io/node-trust-unsigned-allocations": "true"}) == "off"


def test_many_nodes_are_counted_not_all_named() -> None:
    nodes, pods, quotas = objects()
    next(p for p in pods if p["metadata"]["name"] == "infer-1")["status"]["phase"] = "Succeeded"
    _trust(nodes, "top-b", "false")
    for i in range(12):
        nodes.append(node(f"top-x{i:02d}", {
            "hami.io/node-nvidia-register": register(f"top-x{i:02d}", 1),
            "hami.io/node-trust-unsigned-allocations": "true"}))
    line = _signing_lines(nodes, pods, quotas)
    assert "12 nodes (top-x00, " in line and "top-x09, and 2 more) still trust" in line
    assert "top-x10" not in line
