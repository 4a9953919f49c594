"""Priority and preemption for GPU slices in DRA mode, on the real control plane: etcd,
kube-apiserver, kube-controller-manager (resourceclaim and garbage-collector
controllers: they make the pods' claims from hami's templates and deallocate a deleted
pod's claims) and kube-scheduler with hami as its ``prioritize``-only extender, as the
chart configures DRA mode. A real ``hami scheduler --dra-mode`` process is the webhook
the kube-apiserver calls for pods (it turns ``nvidia.com/gpu``/``gpumem`` into claims
from hami's templates) and runs the preemption loop. The nodes' ResourceSlices are
published in-process from a fake inventory (15360 MiB cards); no kubelet runs, so pods
have ``terminationGracePeriodSeconds: 0`` (an eviction removes a bound pod at once) and
a pod that a budget should protect is marked Running as the kubelet would (the Eviction
API ignores budgets for Pending pods). No disruption controller runs, so a budget's
``disruptionsAllowed`` stays unset and the Eviction API refuses every pod it covers (429).

Each test uses its own nodes (a label per test) and confines its pods to them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hami.testing.controlplane import create_gpu_node, wait_until
from hami.testing.scheduler_config import ExtenderConfig

from .drabed import Cards, dra_bed, publish_cards
from .hami_harness import unique

pytestmark = pytest.mark.e2e

SCHEDULER = "hami-dra"
GROUP = "e2e-drapreempt"
LOW, HIGH, NEVER = "e2e-dra-low", "e2e-dra-high", "e2e-dra-high-never"
CARD_MIB = 15360
NS = "default"


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    classes = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value,
                **({"preemptionPolicy": "Never"} if name == NEVER else {})}
               for name, value in ((LOW, 100), (HIGH, 1000), (NEVER, 1000))]
    with dra_bed(tmp_path_factory.mktemp("k8s-drapreempt"), default_scheduler=False,
                 objects=classes, hami_args=["--dra-mode", f"--scheduler-name={SCHEDULER}"],
                 webhook="hami-drapreempt") as dra:
        handle = dra.cp.start_scheduler(scheduler_name=SCHEDULER, extender=ExtenderConfig(
            dra.hami.url, filter_verb=None, bind_verb=None, prioritize_verb="prioritize",
            preempt_verb=None))
        try:
            yield {"cp": dra.cp, "client": dra.client, "hami": dra.hami, "inventory": dra.work}
        finally:
            handle.stop()


@pytest.fixture
def group(bed: dict[str, Any]) -> Iterator[str]:
    from lightkube.resources.core_v1 import Pod
    from lightkube.resources.policy_v1 import PodDisruptionBudget

    client = bed["client"]
    value = unique("d")
    yield value
    for pod in client.list(Pod, namespace=NS, labels={GROUP: value}):
        with contextlib.suppress(Exception):
            client.delete(Pod, pod.metadata.name, namespace=NS, grace_period=0)
    for pdb in client.list(PodDisruptionBudget, namespace=NS, labels={GROUP: value}):
        with contextlib.suppress(Exception):
            client.delete(PodDisruptionBudget, pdb.metadata.name, namespace=NS)


def make_nodes(bed: dict[str, Any], group: str, cards: dict[str, int]) -> list[str]:
    """Nodes (suffix -> number of 15360 MiB cards) labelled for this test, each with its
    ResourceSlice published."""
    names = []
    for suffix, count in cards.items():
        name = f"{suffix}-{group}"
        # hami's scheduler writes its handshake on the new node meanwhile:
        # create_gpu_node retries its taint patch on that conflict
        create_gpu_node(bed["client"], name, gpus=0, labels={GROUP: group})
        publish_cards(bed["client"], name, Path(bed["inventory"]) / f"{name}.json",
                      Cards(count, CARD_MIB))
        names.append(name)
    return names


def create_pod(bed: dict[str, Any], group: str, name: str, node: str, priority_class: str,
               memory_mib: int = 12000, labels: dict[str, str] | None = None) -> str:
    from lightkube import codecs

    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NS, "labels": {GROUP: group, **(labels or {})}},
           "spec": {"priorityClassName": priority_class, "terminationGracePeriodSeconds": 0,
                    "nodeSelector": ({"kubernetes.io/hostname": node} if node
                                     else {GROUP: group}),
                    "containers": [{"name": "c", "image": "pause", "resources": {"limits": {
                        "nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory_mib)}}}]}}
    created = bed["client"].create(codecs.from_dict(pod))
    assert created.spec.resourceClaims, "the DRA webhook did not translate the pod"
    return name


def get(bed: dict[str, Any], name: str) -> dict[str, Any] | None:
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Pod

    try:
        return dict(bed["client"].get(Pod, name, namespace=NS).to_dict())
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise


def device_of(bed: dict[str, Any], pod: dict[str, Any]) -> tuple[str, str] | None:
    """``(pool, device)`` of the pod's allocated claim, None while unallocated."""
    from lightkube.resources.resource_v1 import ResourceClaim

    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    for entry in statuses:
        claim = bed["client"].get(ResourceClaim, entry["resourceClaimName"],
                                  namespace=NS).to_dict()
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                   or {}).get("results") or []
        for r in results:
            return str(r["pool"]), str(r["device"])
    return None


def wait_placed(bed: dict[str, Any], name: str, timeout_s: float = 90
                ) -> tuple[dict[str, Any], tuple[str, str]]:
    """The pod once bound with its claim allocated, and its ``(pool, device)``."""
    seen: dict[str, Any] = {}

    def placed() -> bool:
        pod = get(bed, name)
        if not pod or not pod["spec"].get("nodeName"):
            return False
        seen["pod"], seen["device"] = pod, device_of(bed, pod)
        return seen["device"] is not None

    try:
        wait_until(placed, timeout_s=timeout_s, what=f"pod {name} bound on a device",
                   alive=bed["hami"].alive)
    except Exception:
        dump(bed, name)
        raise
    return seen["pod"], seen["device"]


def dump(bed: dict[str, Any], name: str) -> None:
    from lightkube.resources.core_v1 import Pod

    pod = get(bed, name) or {}
    print("conditions:", (pod.get("status") or {}).get("conditions"))
    for e in events(bed, name):
        print("event", e.reason, e.message)
    for p in bed["client"].list(Pod, namespace=NS):
        print("pod", p.metadata.name, p.spec.nodeName, p.metadata.deletionTimestamp,
              p.status.nominatedNodeName if p.status else None)
    print(bed["hami"].log_tail(60))


def mark_running(bed: dict[str, Any], name: str) -> None:
    """What the kubelet would report (none runs here): phase Running and a start time."""
    from lightkube.resources.core_v1 import Pod

    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    bed["client"].patch(Pod.Status, name, {"status": {"phase": "Running", "startTime": stamp}},
                        namespace=NS)


def events(bed: dict[str, Any], name: str) -> list[Any]:
    from lightkube.resources.core_v1 import Event

    return list(bed["client"].list(Event, namespace=NS, fields={"involvedObject.name": name}))


def fill(bed: dict[str, Any], group: str, nodes: dict[str, int], names: list[str],
         labels: dict[str, dict[str, str]] | None = None
         ) -> dict[str, tuple[dict[str, Any], tuple[str, str]]]:
    """One low-priority 12000 MiB pod per card; returns them placed, by name."""
    pods = []
    for node, count in zip(names, nodes.values(), strict=True):
        for card in range(count):
            name = f"lo-{node}-{card}"
            create_pod(bed, group, name, node, LOW, labels=(labels or {}).get(name))
            pods.append(name)
    placed = {name: wait_placed(bed, name) for name in pods}
    for name in placed:
        mark_running(bed, name)
    return placed


def unschedulable(bed: dict[str, Any], name: str) -> str:
    pod = get(bed, name) or {}
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message", ""))
    return ""


def _budget(bed: dict[str, Any], group: str, app: str) -> None:
    from lightkube import codecs

    bed["client"].create(codecs.from_dict({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": f"keep-{group}", "namespace": NS, "labels": {GROUP: group}},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": app}}}}))


def test_the_minimal_victim_is_evicted_and_the_preemptor_gets_its_device(
        bed: dict[str, Any], group: str) -> None:
    nodes = {"pre": 2, "peer": 1}
    names = make_nodes(bed, group, nodes)
    low = fill(bed, group, {"pre": 2}, names[:1])
    assert len({device for _, device in low.values()}) == 2  # one per card: all full
    # a pod of the preemptor's own priority on the other node: never a victim
    create_pod(bed, group, "peer", names[1], HIGH)
    peer, peer_device = wait_placed(bed, "peer")
    preemptor = create_pod(bed, group, f"hi-{group}", "", HIGH)
    bound, device = wait_placed(bed, preemptor)
    assert bound["spec"]["nodeName"] == names[0]
    gone = [n for n in low if get(bed, n) is None]
    assert len(gone) == 1, gone  # the minimal victims, not more
    (victim,) = gone
    assert device == low[victim][1]  # the freed device, not the other card
    # nobody else was touched
    for name, before in [*((n, low[n][0]) for n in low if n != victim), ("peer", peer)]:
        now = get(bed, name)
        assert now is not None and now["metadata"]["uid"] == before["metadata"]["uid"]
        assert not now["metadata"].get("deletionTimestamp")
    assert device_of(bed, get(bed, "peer") or {}) == peer_device
    card = f"GPU-{names[0]}-{low[victim][1][1].rsplit('-', 1)[1]}"
    # Events are posted in the background: wait for them, then read them
    wait_until(lambda: any(e.reason == "Preempting" for e in events(bed, preemptor))
               and any(e.reason == "Preempted" for e in events(bed, victim)),
               timeout_s=30, what="Preempting and Preempted events")
    reasons = {e.reason: e.message for e in events(bed, preemptor)}
    assert card in reasons["Preempting"], reasons
    preempted = [e.message for e in events(bed, victim) if e.reason == "Preempted"]
    assert card in preempted[0] and preemptor in preempted[0], preempted
    assert bound["status"].get("nominatedNodeName") in (None, names[0])

    def metrics_seen() -> bool:
        _, body = bed["hami"].get("/metrics")
        text = body.decode()
        return ('hami_scheduler_preemptions_total{outcome="evicted"}' in text
                and "hami_scheduler_preemptor_bound_seconds_count" in text)

    wait_until(metrics_seen, timeout_s=30, what="preemption metrics")


def test_a_pod_that_may_not_preempt_evicts_nobody(bed: dict[str, Any], group: str) -> None:
    """``preemptionPolicy: Never`` (from its PriorityClass): the pod waits, nobody is
    evicted; a pod of the same priority that may preempt is served next to it."""
    nodes = {"never": 1}
    names = make_nodes(bed, group, nodes)
    low = fill(bed, group, nodes, names)
    # pinned to its node: the device freed on the other node must not go to it (a pod
    # of equal priority may take a freed slice first; docs/priority-preemption.md)
    waiter = create_pod(bed, group, f"never-{group}", names[0], NEVER)
    wait_until(lambda: bool(unschedulable(bed, waiter)), timeout_s=60,
               what="the Never pod unschedulable")
    other = make_nodes(bed, group, {"next": 1})
    fill(bed, group, {"next": 1}, other)
    create_pod(bed, group, f"hi-{group}", other[0], HIGH)
    wait_placed(bed, f"hi-{group}")  # the loop ran since the Never pod was seen
    for name, (before, _) in low.items():
        now = get(bed, name)
        assert now is not None and now["metadata"]["uid"] == before["metadata"]["uid"]
    assert not (get(bed, waiter) or {})["spec"].get("nodeName")
    assert not any(e.reason == "Preempting" for e in events(bed, waiter))


def test_a_budget_sends_hami_to_another_node(bed: dict[str, Any], group: str) -> None:
    nodes = {"kept": 1, "free": 1}
    names = make_nodes(bed, group, nodes)
    kept = f"lo-{names[0]}-0"
    low = fill(bed, group, nodes, names, labels={kept: {"app": f"kept-{group}"}})
    _budget(bed, group, f"kept-{group}")
    preemptor = create_pod(bed, group, f"hi-{group}", "", HIGH)
    bound, device = wait_placed(bed, preemptor)
    assert bound["spec"]["nodeName"] == names[1]
    assert get(bed, kept) is not None
    assert get(bed, f"lo-{names[1]}-0") is None
    assert device == low[f"lo-{names[1]}-0"][1]


def test_a_refused_eviction_makes_hami_wait_and_say_why(bed: dict[str, Any],
                                                        group: str) -> None:
    nodes = {"only": 1}
    names = make_nodes(bed, group, nodes)
    kept = f"lo-{names[0]}-0"
    fill(bed, group, nodes, names, labels={kept: {"app": f"kept-{group}"}})
    _budget(bed, group, f"kept-{group}")
    preemptor = create_pod(bed, group, f"hi-{group}", "", HIGH)
    try:
        wait_until(lambda: any(e.reason == "PreemptionRefused" for e in events(bed, preemptor)),
                   timeout_s=60, what="PreemptionRefused event")
    except Exception:
        dump(bed, preemptor)
        raise
    message = next(e.message for e in events(bed, preemptor) if e.reason == "PreemptionRefused")
    assert kept in message and "disruption budget" in message
    pod = get(bed, kept)
    assert pod is not None and not pod["metadata"].get("deletionTimestamp")
    assert not (get(bed, preemptor) or {})["spec"].get("nodeName")
