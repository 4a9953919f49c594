"""Namespace quota (spec §5.2), field cases B06 and B08."""

from __future__ import annotations

from hami.core.admission import admit
from hami.core.config import NvidiaConfig, SchedulerConfig
from hami.core.quota import QuotaLedger
from hami.core.state import ClusterState
from tests.builders import case_pod, cluster_from_case, container, pod


def test_limits_usage_and_updates():
    quota = QuotaLedger(NvidiaConfig(memory_factor=2))
    quota.set_quota("ns", "q", {"limits.nvidia.com/gpumem": 1000, "limits.nvidia.com/gpucores": 50,
                                "limits.cpu": 4})
    assert quota.quota("ns").memory_limit_mib == 2000
    quota.charge("ns", 1500, 40)
    assert quota.fits("ns", 500, 10) and not quota.fits("ns", 501, 0)
    assert not quota.fits("ns", 0, 11)
    quota.set_quota("ns", "q", {"limits.nvidia.com/gpucores": 100})  # update: usage survives
    assert quota.fits("ns", 0, 60) and quota.quota("ns").memory_used_mib == 1500
    quota.remove_quota("ns", "q")
    assert quota.fits("ns", 10**9, 10**9) and not quota.limited("ns")
    quota.release("ns", 10**6, 10**6)
    assert quota.quota("ns").memory_used_mib == 0
    assert quota.fits("other", 10**9, 10**9)


def test_b08_explicit_zero_blocks_and_absent_means_unlimited(field_cases):
    case = field_cases["B08"]
    state = cluster_from_case(case)
    state.upsert_quota({"metadata": {"namespace": "locked", "name": "q"},
                        "spec": {"hard": case["scenario"]["config"]["namespace_quota"]}})
    spec = case["scenario"]["pods"][0]
    denied = admit(case_pod(spec), state.config, state.quota)
    assert not denied.allowed and "quota" in denied.message
    # bypassing the webhook, the scheduler refuses too
    decision = state.filter(case_pod(spec))
    assert decision.result.node is None
    assert "ResourceQuotaNotFit" in decision.result.failed_nodes["node-a"]
    # control: a namespace with no quota at all
    open_pod = case_pod({**spec, "namespace": "open"})
    assert admit(open_pod, state.config, state.quota).allowed
    assert state.filter(open_pod).result.node == "node-a"


def test_b06_percentage_pods_are_charged_in_full_with_or_without_init(field_cases):
    case = field_cases["B06"]
    spec = case["scenario"]["pods"][0]
    for with_init in (True, False):
        state = cluster_from_case(case)
        state.upsert_quota({"metadata": {"namespace": "ns1", "name": "q"},
                            "spec": {"hard": {"limits.nvidia.com/gpumem": 24000}}})
        body = dict(spec) if with_init else {k: v for k, v in spec.items() if k != "init_containers"}
        verdict = admit(case_pod(body), state.config, state.quota)
        decision = state.filter(verdict.pod)
        assert decision.result.node is None, with_init
        assert "ResourceQuotaNotFit" in decision.result.failed_nodes["node-a"]


def test_quota_charged_on_commit_and_released_on_delete():
    state = ClusterState(SchedulerConfig())
    from hami.core.model import DeviceInfo
    state.ledger.add_node("n", [DeviceInfo("G0", 0, 10, 10000, 100, "NVIDIA-A10")])
    state.upsert_quota({"metadata": {"namespace": "ns", "name": "q"},
                        "spec": {"hard": {"limits.nvidia.com/gpumem": "6000"}}})
    first = pod("a", [container(gpu=1, gpumem=4000)], namespace="ns")
    d = state.filter(first)
    state.commit(first, d)
    assert state.quota.quota("ns").memory_used_mib == 4000
    second = pod("b", [container(gpu=1, gpumem=4000)], namespace="ns")
    assert state.filter(second).result.node is None
    state.remove_pod(first["metadata"]["uid"])
    assert state.filter(second).result.node == "n"


def test_sources_list_applied_quotas():
    quota = QuotaLedger()
    quota.set_quota("a", "q1", {"limits.nvidia.com/gpumem": 1})
    quota.set_quota("b", "q2", {"limits.nvidia.com/gpucores": 1})
    quota.remove_quota("a", "q1")
    assert quota.sources() == [("b", "q2")]
