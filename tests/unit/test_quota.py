"""Namespace quota (spec §5.2), field cases B06 and B08."""

from __future__ import annotations

from hami.core.admission import admit
from hami.core.model import DeviceInfo
from hami.core.quota import QuotaLedger
from hami.core.state import ClusterState
from hami.devices.nvidia import Nvidia, NvidiaConfig
from hami.devices.registry import make_config
from tests.builders import container, pod


def test_limits_usage_and_updates():
    quota = QuotaLedger(Nvidia(NvidiaConfig(memory_factor=2)).resource_names())
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
    state = ClusterState(make_config())
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
    state = ClusterState(make_config())
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


PLATFORM = {"limits.nvidia.com/gpumem": 1000}
TENANT = {"limits.nvidia.com/gpumem": 5000, "limits.nvidia.com/gpucores": 50}


def test_every_quota_object_of_a_namespace_applies_in_either_order():
    """Issue 11 §4: two ResourceQuotas in ``team-a``; the tightest limit per resource holds
    whichever was written last, and deleting one leaves the other in force."""
    for order in (("platform", PLATFORM), ("tenant", TENANT)), (("tenant", TENANT),
                                                                ("platform", PLATFORM)):
        quota = QuotaLedger()
        for name, hard in order:
            quota.set_quota("team-a", name, hard)
        got = quota.quota("team-a")
        assert (got.memory_limit_mib, got.cores_limit_percent) == (1000, 50), order
        assert not quota.fits("team-a", 3000, 0), order
        quota.remove_quota("team-a", "tenant")
        got = quota.quota("team-a")
        assert (got.memory_limit_mib, got.cores_limit_percent) == (1000, None), order
        assert not quota.fits("team-a", 3000, 0) and quota.fits("team-a", 1000, 100), order


def test_updating_or_deleting_the_tight_quota_falls_back_to_the_others():
    quota = QuotaLedger(Nvidia(NvidiaConfig(memory_factor=2)).resource_names())
    quota.set_quota("team-a", "platform", PLATFORM)
    quota.set_quota("team-a", "tenant", TENANT)
    quota.set_quota("team-a", "extra", {"limits.nvidia.com/gpumem": 3000})
    assert quota.quota("team-a").memory_limit_mib == 2000  # 1000 x memoryFactor
    quota.set_quota("team-a", "platform", {"limits.nvidia.com/gpumem": 4000})  # loosened
    assert quota.quota("team-a").memory_limit_mib == 6000  # "extra" is now the tightest
    quota.remove_quota("team-a", "extra")
    assert quota.quota("team-a").memory_limit_mib == 8000
    quota.set_quota("team-a", "platform", {"limits.cpu": 4})  # no longer limits GPU memory
    assert quota.quota("team-a").memory_limit_mib == 10000
    quota.remove_quota("team-a", "tenant")
    assert not quota.limited("team-a")
    assert quota.sources() == [("team-a", "platform")]


def test_two_quotas_through_the_webhook_and_the_filter():
    """A 3000 MiB pod in ``team-a`` under quotas of 1000 and 5000 MiB is refused by the
    webhook and by the filter in both orders, also after ``tenant`` is deleted."""
    def quota(name, hard):
        return {"metadata": {"namespace": "team-a", "name": name}, "spec": {"hard": hard}}

    for order in ((quota("platform", PLATFORM), quota("tenant", TENANT)),
                  (quota("tenant", TENANT), quota("platform", PLATFORM))):
        state = one_gpu_node("NVIDIA-A10", 24576)
        for q in order:
            state.upsert_quota(q)
        big = pod("big", [container(gpu=1, gpumem=3000)], namespace="team-a")
        for step in ("both", "tenant deleted"):
            verdict = admit(big, state.config, state.quota)
            assert not verdict.allowed and "quota" in verdict.message, step
            decision = state.filter(big)
            assert decision.result.node is None, step
            assert "ResourceQuotaNotFit" in decision.result.failed_nodes["node-a"], step
            state.remove_quota(quota("tenant", {}))
        state.remove_quota(quota("platform", {}))
        assert state.filter(big).result.node == "node-a"
