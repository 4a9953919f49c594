"""Node CPU and memory for DRA mode's ``fragmentation-aware`` order
(:class:`hami.dra.hosts.HostUsage`): pods count on their node until they end or go,
tenant-written quantities never break it."""

from __future__ import annotations

from typing import Any

import pytest

from hami.dra.hosts import MOST, HostUsage, node_allocatable, pod_requests


def _pod(uid: str, node: str | None, cpu: Any = "2", memory: Any = "1Gi",
         phase: str = "Running", init: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
    if init is not None:
        spec["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": init}}}]
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"uid": uid}, "spec": spec, "status": {"phase": phase}}


def test_pods_count_on_their_node_until_they_end_or_go() -> None:
    nodes = {"a": {"status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}}}
    hosts = HostUsage(nodes)
    hosts.refresh()
    assert hosts.of("a") == (8000, 32768, 0, 0)
    assert hosts.of("b") == (-1, -1, 0, 0)             # no Node object: not checked
    hosts.observe_pod(_pod("p", None), False)          # not bound: nothing
    hosts.observe_pod(_pod("p", "a"), False)
    hosts.observe_pod(_pod("q", "a", cpu="500m", init="3"), False)  # the init's 3 cores
    assert hosts.of("a") == (8000, 32768, 5000, 2048)
    seq = hosts.seq
    hosts.observe_pod(_pod("p", "a"), False)           # the same: no change
    assert hosts.seq == seq
    hosts.observe_pod(_pod("p", "a", phase="Succeeded"), False)
    assert hosts.of("a")[2:] == (3000, 1024) and hosts.changed(seq) == ["a"]
    hosts.observe_pod(_pod("q", "a"), True)
    assert hosts.of("a")[2:] == (0, 0)
    nodes["a"] = {"status": {"allocatable": {"cpu": "16", "memory": "32Gi"}}}
    seq = hosts.seq
    hosts.refresh()
    assert hosts.of("a")[0] == 16000 and hosts.changed(seq) == ["a"]
    del nodes["a"]
    hosts.refresh()
    assert hosts.of("a")[:2] == (-1, -1)


@pytest.mark.parametrize("cpu", ["1e30", "-3", "lots", 7.5, ["x"], None])
def test_hostile_quantities_are_clamped_or_nothing(cpu: Any) -> None:
    """The pod spec is tenant-written: a huge, negative or malformed request counts
    within 0..MOST, or as nothing, and never raises."""
    got = pod_requests(_pod("p", "a", cpu=cpu))
    assert all(0 <= v <= MOST for v in got)
    hosts = HostUsage({})
    for k in range(3):
        hosts.observe_pod(_pod(f"p{k}", "a", cpu=cpu, memory=cpu), False)
    assert all(0 <= v <= 3 * MOST for v in hosts.of("a")[2:])
    hosts.observe_pod({"metadata": 5, "spec": [], "status": "x"}, False)
    assert node_allocatable({"status": {"allocatable": {"cpu": cpu}}})[0] in (
        -1, 0, MOST, 7500)
