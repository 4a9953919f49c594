"""GPU sidecars (restartable init containers, Kubernetes KEP-753) through the scheduler's
real aiohttp server (webhook and extender) on the in-memory API (issue 25 item 1): a
sidecar runs for the pod's whole life, so admission, quota, fit and the ledger count it
beside the app containers, and ``hami schedule`` decides the same."""

from __future__ import annotations

from typing import Any

from hami.devices.registry import make_config
from hami.offline import schedule

from .fake_kube import FakeKube
from .support import gpu_pod, ledger_snapshot, node, run, serving

CARD_MIB = 16384


def sidecar_pod(name: str, sidecar_mib: int, app_mib: int, namespace: str = "a",
                init_mib: int | None = None) -> dict[str, Any]:
    """A pod with a GPU sidecar (and, with ``init_mib``, an ordinary GPU init container
    before it) and a GPU app container."""
    pod = gpu_pod(name, memory_mib=app_mib, namespace=namespace)
    side = {"name": "side", "image": "x", "restartPolicy": "Always", "resources": {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(sidecar_mib)}}}
    init = [] if init_mib is None else [{"name": "warm", "image": "x", "resources": {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(init_mib)}}}]
    pod["spec"]["initContainers"] = [*init, side]
    return pod


def quota(namespace: str, mib: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": namespace},
            "spec": {"hard": {"limits.nvidia.com/gpumem": str(mib)}}}


def review(pod: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "operation": "CREATE", "object": pod}}


def booked(h: Any) -> list[tuple[int, int, int]]:
    """``(slots, memory MiB, cores %)`` booked per card of node n1."""
    return [(s, m, c) for _, s, m, c in h.engine.state.ledger.device_usage("n1")]


def test_a_tenant_cannot_pass_its_quota_through_a_sidecar() -> None:
    """Attacker: 10000 MiB sidecar + 10000 MiB app under a 10000 MiB quota. The webhook
    refuses it; a copy that skipped the webhook is refused by /filter's quota check
    (before: admitted, and charged 10000 MiB)."""
    async def scenario() -> None:
        kube = FakeKube()
        kube.put("Node", node("n1", gpus=1, memory_mib=32768))
        kube.put("ResourceQuota", quota("a", 10000))
        async with serving(kube) as h:
            attack = sidecar_pod("attack", 10000, 10000)
            resp = (await h.post("/webhook", review(attack)))["response"]
            assert not resp["allowed"] and resp["status"]["code"] == 403
            assert resp["status"]["message"].startswith(
                "exceeding resource quota: namespace a asks for 20000 MiB")
            before = ledger_snapshot(h.engine)
            attack["metadata"]["labels"] = {"hami.io/webhook": "ignore"}
            live = h.kube.put("Pod", attack)
            result = await h.filter(live, ["n1"])
            assert result["NodeNames"] is None
            assert result["FailedNodes"] == {"n1": "1/1 ResourceQuotaNotFit"}
            assert ledger_snapshot(h.engine) == before
            # honest: the same shape within the quota is admitted and charged in full
            honest = sidecar_pod("honest", 5000, 5000)
            assert (await h.post("/webhook", review(honest)))["response"]["allowed"]
            live = h.kube.put("Pod", honest)
            assert (await h.filter(live, ["n1"]))["NodeNames"] == ["n1"]
            assert h.engine.state.quota.namespaces()["a"].memory_used_mib == 10000
            assert booked(h) == [(2, 10000, 0)]

    run(scenario)


def test_a_sidecar_cannot_overbook_the_card() -> None:
    """Attacker: 10000 + 10000 MiB on one 16384 MiB card is not placed; another
    namespace's 6384 MiB pod then has the card alone (before: 26384 MiB granted on the
    card, 16384 MiB booked)."""
    async def scenario() -> None:
        kube = FakeKube()
        kube.put("Node", node("n1", gpus=1, memory_mib=CARD_MIB))
        async with serving(kube) as h:
            attack = h.kube.put("Pod", sidecar_pod("attack", 10000, 10000))
            result = await h.filter(attack, ["n1"])
            assert result["NodeNames"] is None
            assert result["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"}
            other = h.kube.put("Pod", gpu_pod("other", memory_mib=6384, namespace="b"))
            assert (await h.filter(other, ["n1"]))["NodeNames"] == ["n1"]
            assert booked(h) == [(1, 6384, 0)]

    run(scenario)


def test_an_honest_sidecar_is_booked_and_served_its_own_entry() -> None:
    """Honest: an init container, a 6000 MiB sidecar and a 6000 MiB app container: one
    entry each in HAMi's order, 12000 MiB booked for the pod's life (also after a
    restart of the scheduler and once the init container finished); a 6000 MiB pod that
    would fit beside the app container alone stays off the card; ``hami schedule``
    decides the same."""
    pods = [sidecar_pod("side", 6000, 6000, init_mib=3000),
            gpu_pod("late", memory_mib=6000, namespace="b")]

    async def scenario() -> None:
        kube = FakeKube()
        kube.put("Node", node("n1", gpus=1, memory_mib=CARD_MIB))
        offline = schedule([node("n1", gpus=1, memory_mib=CARD_MIB), *pods], make_config())
        async with serving(kube) as h:
            resp = (await h.post("/webhook", review(pods[0])))["response"]
            assert resp["allowed"] and offline["pods"][0]["admission"]["allowed"]
            live = kube.put("Pod", pods[0])
            assert (await h.filter(live, ["n1"]))["NodeNames"] == ["n1"]
            ann = kube.pod("side", "a")["metadata"]["annotations"]
            expected = offline["pods"][0]["annotations"]
            assert {k: ann[k] for k in expected} == expected
            uuid = "GPU-n1-0"
            assert ann["hami.io/vgpu-devices-allocated"] == (
                f"{uuid},NVIDIA,3000,0:;{uuid},NVIDIA,6000,0:;{uuid},NVIDIA,6000,0:;")
            assert booked(h) == [(2, 12000, 0)]
            late = kube.put("Pod", pods[1])
            result = await h.filter(late, ["n1"])
            assert result["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"}
            assert offline["pods"][1]["node"] is None
            assert offline["pods"][1]["failed_nodes"] == result["FailedNodes"]
            snapshot = ledger_snapshot(h.engine)
        bound = kube.pod("side", "a")
        bound["spec"]["nodeName"] = "n1"
        bound["status"] = {"phase": "Running", "initContainerStatuses": [
            {"name": "warm", "state": {"terminated": {"exitCode": 0}}},
            {"name": "side", "state": {"running": {}}}]}
        kube.put("Pod", bound)
        async with serving(kube) as h2:  # a fresh replica rebuilds from the annotations
            assert ledger_snapshot(h2.engine) == snapshot
            assert booked(h2) == [(2, 12000, 0)]

    run(scenario)
