"""The monitor honours task priority 0 only for pods of the namespaces the operator
granted it (``hami monitor --high-priority-namespaces``, the chart passes the
scheduler's list), a second line behind admission: in DRA mode nothing re-checks a pod
admitted while the webhook failed (``failurePolicy: Ignore`` by default) or one using
a claim the webhook did not recognise, and before this the monitor believed the env of
any pod. Through the real monitor loop (``run_monitor``) on real region files."""

from __future__ import annotations

from pathlib import Path

from hami.deviceplugin.allocate import ContainerView, PodView
from hami.monitor.claims import ClaimOwner, PodRef, attribute
from hami.monitor.pods import DEFAULT_PRIORITY, container_grants
from tests.node.test_monitor_bounds import victim_blocked


def test_priority_0_outside_the_grant_blocks_nobody(tmp_path: Path) -> None:
    assert sum(victim_blocked(tmp_path / "none", "0", 5, frozenset())) == 0      # was 4
    assert sum(victim_blocked(tmp_path / "other", "0", 5, frozenset({"inference"}))) == 0


def test_priority_0_in_a_granted_namespace_still_blocks(tmp_path: Path) -> None:
    assert sum(victim_blocked(tmp_path, "0", 5, frozenset({"ns"}))) == 4


def test_grants_and_claims_downgrade_only_priority_0() -> None:
    pod = PodView("tenant", "p", "u1", "node-a", "Running", {},
                  (ContainerView("zero", {"CUDA_TASK_PRIORITY": "0"}),
                   ContainerView("two", {"CUDA_TASK_PRIORITY": "2"})))
    grants = container_grants(pod, frozenset({"inference"}))
    assert grants["zero"].priority == DEFAULT_PRIORITY and grants["two"].priority == 2
    assert container_grants(pod, frozenset({"tenant"}))["zero"].priority == 0
    owner = ClaimOwner("c1", "tenant", "claim", ("GPU-0",),
                       (PodRef("tenant", "p", "u1", ("zero",)),))
    use = attribute(owner, [pod], frozenset())
    assert use is not None and use.priority == DEFAULT_PRIORITY
    granted = attribute(owner, [pod], frozenset({"tenant"}))
    assert granted is not None and granted.priority == 0
