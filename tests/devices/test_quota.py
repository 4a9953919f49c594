"""Quota across vendors (spec §5.2): limits per resource name, memoryFactor on memory
limits, explicit 0 blocks, webhook pre-check max(app sum, init max), fit-time check."""

from __future__ import annotations

from hami.core.model import ContainerDevice
from hami.core.state import ClusterState
from hami.core.vendor_quota import VendorQuota
from hami.core.vendors import pod_requests
from hami.devices.registry import build_registry, make_config
from tests.devices.util import ctr, dev, pod

REG = build_registry({"nvidia": {}, "hygon": {"memoryFactor": 2}, "cambricon": {}})


def test_limits_only_for_tracked_names() -> None:
    q = VendorQuota(REG)
    q.set_quota("ns", "rq", {"limits.hygon.com/dcumem": "1000", "limits.cpu": "4",
                             "limits.cambricon.com/mlu.smlu.vcore": "50",
                             "limits.nvidia.com/gpucores": "1.5"})
    assert q.limit("ns", "hygon.com/dcumem") == 1000
    assert q.limit("ns", "cambricon.com/mlu.smlu.vcore") == 50
    assert q.limit("ns", "nvidia.com/gpucores") is None  # not an integer
    assert q.limit("ns", "cpu") is None


def test_memory_factor_and_zero_limit() -> None:
    q = VendorQuota(REG)
    q.set_quota("ns", "rq", {"limits.hygon.com/dcumem": 1000,
                             "limits.cambricon.com/mlu.smlu.vcore": 0})
    assert q.fits("ns", "DCU", 2000, 0) and not q.fits("ns", "DCU", 2001, 0)
    assert not q.fits("ns", "MLU", 0, 1) and q.fits("ns", "MLU", 10, 0)
    assert q.fits("other", "MLU", 0, 100) and q.fits("ns", "Unknown", 10**9, 10**9)
    q.remove_quota("ns", "rq")
    assert q.fits("ns", "DCU", 10**6, 0)


def test_usage_collapses_init_containers() -> None:
    q = VendorQuota(REG)
    grant = {"DCU": ((ContainerDevice("d", "DCU", 3000, 10),),
                     (ContainerDevice("d", "DCU", 1000, 20),),
                     (ContainerDevice("d", "DCU", 1000, 20),))}
    q.add_usage("ns", grant, n_init=1)
    assert q.used("ns", "hygon.com/dcumem") == 3000  # max(init 3000, app 2000)
    assert q.used("ns", "hygon.com/dcucores") == 40
    q.remove_usage("ns", grant, n_init=1)
    q.remove_usage("ns", grant, n_init=1)
    assert q.used("ns", "hygon.com/dcumem") == 0


def test_admission_precheck_per_vendor() -> None:
    q = VendorQuota(REG)
    q.set_quota("ns", "rq", {"limits.hygon.com/dcumem": 1500})  # x2 = 3000 MiB
    ok = pod(ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 700}),
             ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 800}),
             init=[ctr({"hygon.com/dcunum": 2, "hygon.com/dcumem": 750})])
    assert q.admission_denial("ns", pod_requests(REG, ok)) == ""
    too_much = pod(ctr({"hygon.com/dcunum": 2, "hygon.com/dcumem": 800}))
    assert q.admission_denial("ns", pod_requests(REG, too_much)) == "exceeding resource quota"


def test_fit_time_quota() -> None:
    p = pod(ctr({"hygon.com/dcunum": 1, "hygon.com/dcucores": 30}, name="a"),
            ctr({"hygon.com/dcunum": 1, "hygon.com/dcucores": 30}, name="b"))
    for namespace, reason in (("ns", "2/2 ResourceQuotaNotFit"), ("elsewhere", "")):
        st = ClusterState(make_config(registry=REG))
        st.ledger.add_node("n1", [dev("d0", "DCU"), dev("d1", "DCU", index=1)])
        st.upsert_quota({"metadata": {"name": "rq", "namespace": "ns"},
                         "spec": {"hard": {"limits.hygon.com/dcucores": 50}}})
        p["metadata"]["namespace"] = namespace
        out = st.filter(p, ["n1"]).result
        assert out.failed_nodes == ({"n1": reason} if reason else {}), namespace
        assert (out.node is None) is bool(reason)


def test_every_quota_object_of_a_namespace_applies() -> None:
    """Issue 11 §4 for other vendors: the tightest limit per resource name holds in either
    write order; deleting or loosening one quota leaves the others in force."""
    platform = {"limits.hygon.com/dcumem": "1000"}
    tenant = {"limits.hygon.com/dcumem": "5000", "limits.hygon.com/dcucores": "50"}
    for order in (("platform", platform), ("tenant", tenant)), (("tenant", tenant),
                                                                ("platform", platform)):
        q = VendorQuota(REG)
        for name, hard in order:
            q.set_quota("team-a", name, hard)
        assert q.limit("team-a", "hygon.com/dcumem") == 1000, order
        assert q.limit("team-a", "hygon.com/dcucores") == 50, order
        assert not q.fits("team-a", "DCU", 3000, 0), order  # 1000 x memoryFactor 2 = 2000
        q.remove_quota("team-a", "tenant")
        assert q.limit("team-a", "hygon.com/dcumem") == 1000, order
        assert q.limit("team-a", "hygon.com/dcucores") is None, order
        assert not q.fits("team-a", "DCU", 3000, 0) and q.fits("team-a", "DCU", 2000, 100)
        q.set_quota("team-a", "tenant", tenant)
        q.set_quota("team-a", "platform", {"limits.hygon.com/dcumem": "8000"})  # loosened
        assert q.limit("team-a", "hygon.com/dcumem") == 5000, order
        q.remove_quota("team-a", "platform")
        assert q.limited() == [("team-a", "hygon.com/dcucores", 50, 0),
                               ("team-a", "hygon.com/dcumem", 5000, 0)]
