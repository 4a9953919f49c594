"""Namespace quota (spec §5.2), field cases B06 and B08."""

from __future__ import annotations

from hami.core.admission import admit
from hami.core.config import NvidiaConfig, SchedulerConfig
from hami.core.model import DeviceInfo
from hami.core.quota import QuotaLedger
from hami.core.state import ClusterState
from tests.builders import container, pod


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


def one_gpu_node(model, mem):
    """A scheduler whose only node, ``node-a``, has one idle card ``GPU-0``."""
    state = ClusterState()
    state.ledger.add_node("node-a", [DeviceInfo("GPU-0", 0, 10, mem, 100, model)])
    return state


def test_b08_explicit_zero_blocks_and_absent_means_unlimited():
    """B08: a quota of 0 GPU memory is a hard "none allowed", not "no limit"."""
    state = one_gpu_node("NVIDIA-A10", 24576)
    state.upsert_quota({"metadata": {"namespace": "locked", "name": "q"},
                        "spec": {"hard": {"limits.nvidia.com/gpumem": 0}}})

    def small(namespace):
        return pod("p", [container(gpu=1, gpumem=1000)], namespace=namespace)

    denied = admit(small("locked"), state.config, state.quota)
    assert not denied.allowed and "quota" in denied.message
    # bypassing the webhook, the scheduler refuses too
    decision = state.filter(small("locked"))
    assert decision.result.node is None
    assert "ResourceQuotaNotFit" in decision.result.failed_nodes["node-a"]
    # control: a namespace with no quota at all
    open_pod = small("open")
    assert admit(open_pod, state.config, state.quota).allowed
    assert state.filter(open_pod).result.node == "node-a"


def test_b06_percentage_pods_are_charged_in_full_with_or_without_init():
    """B06: a GPU-less init container must not shift which containers the quota charges."""
    for with_init in (True, False):
        apps = [container("a", gpu=1, gpumem_percentage=40),
                container("b", gpu=1, gpumem_percentage=40)]
        state = one_gpu_node("NVIDIA-A100-40GB", 40000)
        state.upsert_quota({"metadata": {"namespace": "ns1", "name": "q"},
                            "spec": {"hard": {"limits.nvidia.com/gpumem": 24000}}})
        body = pod("two-apps", apps, [container("setup")] if with_init else None, namespace="ns1")
        verdict = admit(body, state.config, state.quota)
        decision = state.filter(verdict.pod)
        assert decision.result.node is None, with_init
        assert "ResourceQuotaNotFit" in decision.result.failed_nodes["node-a"]


def test_quota_charged_on_commit_and_released_on_delete():
    state = ClusterState(SchedulerConfig())
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
