"""Priority and preemption for GPU slices on the real control plane (etcd,
kube-apiserver, kube-scheduler of the pinned release) in extender mode.

Two hami scheduler processes: ``hami-scheduler`` with preemption on (the default) and
``hami-off`` with ``--no-preemption``, each behind its own kube-scheduler profile; each
test uses its own nodes. No kubelet runs: :class:`FakeAllocator` plays the device
plugin's part; pods have ``terminationGracePeriodSeconds: 0``, so an eviction removes a
bound pod at once. No kube-controller-manager runs either, so no PodDisruptionBudget is
ever observed and the Eviction API refuses every pod a budget covers (429).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, codecs
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.resources.scheduling_v1 import PriorityClass

from hami.core.codec import decode_pod_devices
from hami.testing.controlplane import ControlPlane, SchedulerHandle, wait_until
from hami.testing.scheduler_config import ExtenderConfig

from .hami_harness import FakeAllocator, HamiProcess, Tls, gpu_pod, make_gpu_node, unique

pytestmark = pytest.mark.e2e

GROUP = "e2e-preempt"
LOW, MID, HIGH = "e2e-gpu-low", "e2e-gpu-mid", "e2e-gpu-high"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hami-preempt")


@pytest.fixture(scope="module")
def classes(kube_client: Any) -> Iterator[None]:
    for name, value in ((LOW, 100), (MID, 500), (HIGH, 1000)):
        with contextlib.suppress(ApiError):
            kube_client.create(codecs.from_dict({
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value}))
    yield
    for name in (LOW, MID, HIGH):
        with contextlib.suppress(ApiError):
            kube_client.delete(PriorityClass, name)


@pytest.fixture(scope="module")
def allocator(control_plane: ControlPlane) -> Iterator[FakeAllocator]:
    fake = FakeAllocator(control_plane).start()
    yield fake
    fake.stop()


def _hami(cp: ControlPlane, workdir: Path, name: str, args: list[str]
          ) -> Iterator[tuple[HamiProcess, SchedulerHandle]]:
    proc = HamiProcess(cp, Tls(workdir / f"tls-{name}"), workdir, name=name,
                       args=[f"--scheduler-name={name}", *args]).start()
    handle = cp.start_scheduler(scheduler_name=name, extender=ExtenderConfig(proc.url))
    yield proc, handle
    handle.stop()
    proc.stop()


@pytest.fixture(scope="module")
def hami_on(control_plane: ControlPlane, workdir: Path, classes: None,
            allocator: FakeAllocator) -> Iterator[tuple[HamiProcess, SchedulerHandle]]:
    yield from _hami(control_plane, workdir, "hami-scheduler", [])


@pytest.fixture(scope="module")
def hami_off(control_plane: ControlPlane, workdir: Path, classes: None,
             allocator: FakeAllocator) -> Iterator[tuple[HamiProcess, SchedulerHandle]]:
    yield from _hami(control_plane, workdir, "hami-off", ["--no-preemption"])


@pytest.fixture
def group(kube_client: Any) -> Iterator[str]:
    value = unique("p")
    yield value
    for pod in kube_client.list(Pod, namespace="default", labels={GROUP: value}):
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, pod.metadata.name, namespace="default", grace_period=0)
    for pdb in kube_client.list(PodDisruptionBudget, namespace="default",
                                labels={GROUP: value}):
        with contextlib.suppress(ApiError):
            kube_client.delete(PodDisruptionBudget, pdb.metadata.name, namespace="default")


def make_nodes(client: Any, group: str, cards: dict[str, int]) -> list[str]:
    """Nodes (suffix -> number of 15360 MiB cards) labelled for this test."""
    names = []
    for suffix, count in cards.items():
        name = f"{suffix}-{group}"
        make_gpu_node(client, name, gpus=count, memory_mib=15360, labels={GROUP: group})
        names.append(name)
    return names


def create_pod(client: Any, group: str, name: str, node: str, priority_class: str,
               scheduler: str, memory_mib: int = 12000,
               labels: dict[str, str] | None = None) -> str:
    pod = gpu_pod(name, memory_mib=memory_mib, scheduler_name=scheduler,
                  node_selector={"kubernetes.io/hostname": node} if node else {GROUP: group})
    pod["metadata"]["labels"] = {GROUP: group, **(labels or {})}
    pod["spec"]["priorityClassName"] = priority_class
    client.create(codecs.from_dict(pod))
    return name


def get(client: Any, name: str) -> dict[str, Any] | None:
    try:
        return dict(client.get(Pod, name, namespace="default").to_dict())
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise


def wait_bound(client: Any, name: str, timeout_s: float = 60) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def bound() -> bool:
        seen["pod"] = get(client, name)
        return bool(seen["pod"] and seen["pod"]["spec"].get("nodeName"))

    wait_until(bound, timeout_s=timeout_s, what=f"pod {name} bound")
    return seen["pod"]


def cards_of(pod: dict[str, Any]) -> set[str]:
    allocated = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
    return {d.uuid for c in decode_pod_devices(allocated) for d in c}


def unschedulable(client: Any, name: str) -> str:
    pod = get(client, name) or {}
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message", ""))
    return ""


def events(client: Any, name: str) -> list[Any]:
    return list(client.list(Event, namespace="default",
                            fields={"involvedObject.name": name}))


def fill(client: Any, group: str, nodes: dict[str, int], names: list[str], scheduler: str,
         labels: dict[str, dict[str, str]] | None = None) -> dict[str, dict[str, Any]]:
    """One low-priority 12000 MiB pod per card; returns them bound, by name."""
    pods = {}
    for node, count in zip(names, nodes.values(), strict=True):
        for card in range(count):
            name = f"lo-{node}-{card}"
            create_pod(client, group, name, node, LOW, scheduler,
                       labels=(labels or {}).get(name))
            pods[name] = name
    bound = {name: wait_bound(client, name) for name in pods}
    for name in bound:
        mark_running(client, name)
    return bound


def mark_running(client: Any, name: str) -> None:
    """What the kubelet would report (none runs here): phase Running and a start time.
    The Eviction API ignores PodDisruptionBudgets for Pending pods, so a budget protects
    only running ones."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    client.patch(Pod.Status, name, {"status": {"phase": "Running", "startTime": stamp}},
                 namespace="default")


def test_symptom_without_preemption_the_pod_stays_pending(
        kube_client: Any, hami_off: Any, group: str) -> None:
    """The issue's symptom, kept visible with ``--no-preemption``: kube-scheduler's own dry
    run cannot see device memory and finds no victim."""
    nodes = {"off": 2}
    names = make_nodes(kube_client, group, nodes)
    fill(kube_client, group, nodes, names, "hami-off")
    create_pod(kube_client, group, f"hi-{group}", "", HIGH, "hami-off")
    wait_until(lambda: "expected at least one victim pod" in unschedulable(
        kube_client, f"hi-{group}"), timeout_s=60, what="kube-scheduler's preemption message")
    assert "CardInsufficientMemory" in unschedulable(kube_client, f"hi-{group}")
    assert not (get(kube_client, f"hi-{group}") or {})["spec"].get("nodeName")


def test_the_minimal_victim_is_evicted_and_the_preemptor_bound_to_its_card(
        kube_client: Any, hami_on: Any, group: str) -> None:
    hami, _ = hami_on
    nodes = {"pre": 2, "peer": 1}
    names = make_nodes(kube_client, group, nodes)
    low = fill(kube_client, group, {"pre": 2}, names[:1], "hami-scheduler")
    # a pod of the preemptor's own priority on the other node: never a victim
    create_pod(kube_client, group, "peer", names[1], HIGH, "hami-scheduler")
    peer = wait_bound(kube_client, "peer")
    preemptor = create_pod(kube_client, group, f"hi-{group}", "", HIGH, "hami-scheduler")
    try:
        bound = wait_bound(kube_client, preemptor, timeout_s=90)
    except Exception:
        print("unschedulable:", unschedulable(kube_client, preemptor))
        for e in events(kube_client, preemptor):
            print("event", e.reason, e.message)
        for p in kube_client.list(Pod, namespace="default", labels={GROUP: group}):
            print("pod", p.metadata.name, p.spec.nodeName, p.metadata.deletionTimestamp,
                  p.status.nominatedNodeName)
        print("metrics", [m for m in hami.metrics().splitlines() if "preempt" in m])
        raise
    assert bound["spec"]["nodeName"] == names[0]
    gone = [n for n in low if get(kube_client, n) is None]
    assert len(gone) == 1, gone
    (victim,) = gone
    assert cards_of(bound) == cards_of(low[victim])  # the freed card, not the other
    # nobody else was touched
    for name, before in [*((n, low[n]) for n in low if n != victim), ("peer", peer)]:
        now = get(kube_client, name)
        assert now is not None and now["metadata"]["uid"] == before["metadata"]["uid"]
        assert not now["metadata"].get("deletionTimestamp")
    # hami posts its events from a queue: wait for them, not for the bind
    wait_until(lambda: any(e.reason == "Preempting" for e in events(kube_client, preemptor))
               and any(e.reason == "Preempted" for e in events(kube_client, victim)),
               timeout_s=30, what="the Preempting and Preempted events")
    preempted = [e for e in events(kube_client, victim) if e.reason == "Preempted"]
    assert preempted and next(iter(cards_of(low[victim]))) in preempted[0].message
    metrics = hami.metrics()
    assert 'hami_scheduler_preemptions_total{outcome="evicted"} 1.0' in metrics
    assert "hami_scheduler_preemption_victims_total 1.0" in metrics
    assert "hami_scheduler_preemptor_bound_seconds_count 1.0" in metrics


def _budget(client: Any, group: str, app: str) -> None:
    client.create(codecs.from_dict({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": f"keep-{group}", "namespace": "default", "labels": {GROUP: group}},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": app}}}}))


def test_a_budget_sends_hami_to_another_node(kube_client: Any, hami_on: Any,
                                             group: str) -> None:
    nodes = {"kept": 1, "free": 1}
    names = make_nodes(kube_client, group, nodes)
    kept = f"lo-{names[0]}-0"
    low = fill(kube_client, group, nodes, names, "hami-scheduler",
               labels={kept: {"app": f"kept-{group}"}})
    _budget(kube_client, group, f"kept-{group}")
    preemptor = create_pod(kube_client, group, f"hi-{group}", "", HIGH, "hami-scheduler")
    bound = wait_bound(kube_client, preemptor, timeout_s=90)
    assert bound["spec"]["nodeName"] == names[1]
    assert get(kube_client, kept) is not None
    assert get(kube_client, f"lo-{names[1]}-0") is None
    assert set(low) == {kept, f"lo-{names[1]}-0"}


def test_a_refused_eviction_makes_hami_wait_and_say_why(kube_client: Any, hami_on: Any,
                                                        group: str) -> None:
    nodes = {"only": 1}
    names = make_nodes(kube_client, group, nodes)
    kept = f"lo-{names[0]}-0"
    fill(kube_client, group, nodes, names, "hami-scheduler",
         labels={kept: {"app": f"kept-{group}"}})
    _budget(kube_client, group, f"kept-{group}")
    preemptor = create_pod(kube_client, group, f"hi-{group}", "", HIGH, "hami-scheduler")
    wait_until(lambda: any(e.reason == "PreemptionRefused" for e in events(kube_client, preemptor)),
               timeout_s=60, what="PreemptionRefused event")
    message = next(e.message for e in events(kube_client, preemptor)
                   if e.reason == "PreemptionRefused")
    assert kept in message and "disruption budget" in message
    pod = get(kube_client, kept)
    assert pod is not None and not pod["metadata"].get("deletionTimestamp")
    assert not (get(kube_client, preemptor) or {})["spec"].get("nodeName")


def test_20_preemptors_at_once_evict_no_more_than_needed(kube_client: Any, hami_on: Any,
                                                         group: str) -> None:
    """5 nodes of two 15360 MiB cards, each card full with two low-priority 7000 MiB pods
    (1360 MiB free); 20 high-priority 3000 MiB pods arrive at once. A card with one victim
    gone holds two of them, an emptied card five: at least 8 evictions are needed (four
    emptied cards), and 10 (one per card) would do; every eviction must leave room that a
    preemptor uses, and no card is ever booked over its memory, cores or slots."""
    from concurrent.futures import ThreadPoolExecutor

    from lightkube.resources.core_v1 import Node

    from hami.core.codec import decode_node_devices

    nodes = {f"burst{i}": 2 for i in range(5)}
    names = make_nodes(kube_client, group, nodes)
    low_names = []
    for node in names:
        for k in range(4):
            low_names.append(create_pod(kube_client, group, f"lo-{node}-{k}", node, LOW,
                                        "hami-scheduler", memory_mib=7000))
    low = {n: wait_bound(kube_client, n) for n in low_names}
    for n in low_names:
        mark_running(kube_client, n)
    high = [f"hi-{group}-{i:02d}" for i in range(20)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: create_pod(kube_client, group, n, "", HIGH, "hami-scheduler",
                                           memory_mib=3000), high))
    bound = {n: wait_bound(kube_client, n, timeout_s=240) for n in high}
    gone = [n for n in low if get(kube_client, n) is None]
    assert 8 <= len(gone) <= 10, gone
    used_cards = {c for p in bound.values() for c in cards_of(p)}
    for victim in gone:  # every eviction made room that a preemptor took
        assert cards_of(low[victim]) <= used_cards
    devices = {d.uuid: d for n in names for d in decode_node_devices(
        kube_client.get(Node, n).metadata.annotations["hami.io/node-nvidia-register"])}
    held: dict[str, list[int]] = {}
    for pod in [*bound.values(), *(get(kube_client, n) for n in low if n not in gone)]:
        assert pod is not None
        allocated = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
        for container in decode_pod_devices(allocated):
            for dev in container:
                use = held.setdefault(dev.uuid, [0, 0, 0])
                use[0] += dev.used_memory_mib
                use[1] += dev.used_cores_percent
                use[2] += 1
    for uuid, (memory, cores, count) in held.items():
        dev = devices[uuid]
        assert memory <= dev.memory_mib and cores <= dev.cores_percent
        assert count <= dev.split_count
    print(f"20 preemptors over 10 full cards: {len(gone)} evictions (8 needed at least)")


def _pods_full_node(client: Any, group: str, suffix: str, scheduler: str
                    ) -> tuple[str, dict[str, dict[str, Any]]]:
    """A node of two 15360 MiB cards: ``a`` (priority 500, 12000 MiB) on one card,
    ``h`` (priority 1000, 12000 MiB) on the other, ``b`` (priority 100, 2000 MiB) on
    either; then the node's pod capacity is cut to 3, so kube-scheduler's own dry run
    finds a victim (for the pod count): ``b``, the least important, whose 2000 MiB help
    no card hold 12000 MiB."""
    from hami.testing.controlplane import set_node_status

    (node,) = make_nodes(client, group, {suffix: 2})
    pods = {}
    for short, cls, memory in (("a", MID, 12000), ("h", HIGH, 12000), ("b", LOW, 2000)):
        name = f"{short}-{node}"
        create_pod(client, group, name, node, cls, scheduler, memory_mib=memory)
        pods[short] = wait_bound(client, name)
        mark_running(client, name)
    set_node_status(client, node, capacity={"cpu": "64", "memory": "512Gi", "pods": "3",
                                            "nvidia.com/gpu": "20"})
    return node, pods


def test_the_preempt_verb_replaces_kube_schedulers_blind_victim(
        kube_client: Any, hami_on: Any, group: str) -> None:
    node, pods = _pods_full_node(kube_client, group, "verb", "hami-scheduler")
    preemptor = create_pod(kube_client, group, f"hi-{group}", node, HIGH, "hami-scheduler")
    bound = wait_bound(kube_client, preemptor, timeout_s=90)
    assert get(kube_client, f"a-{node}") is None  # hami's victim: it frees the card
    for short in ("b", "h"):
        now = get(kube_client, f"{short}-{node}")
        assert now is not None and not now["metadata"].get("deletionTimestamp")
    assert cards_of(bound) == cards_of(pods["a"])


def test_without_hami_kube_schedulers_victim_frees_a_useless_card(
        kube_client: Any, hami_off: Any, group: str) -> None:
    """The issue's second symptom, kept visible with ``--no-preemption`` (the preempt verb
    then hands kube-scheduler's victims back unchanged)."""
    node, _ = _pods_full_node(kube_client, group, "blind", "hami-off")
    preemptor = create_pod(kube_client, group, f"hi-{group}", node, HIGH, "hami-off")
    wait_until(lambda: get(kube_client, f"b-{node}") is None, timeout_s=60,
               what="kube-scheduler's own victim gone")
    wait_until(lambda: "CardInsufficientMemory" in unschedulable(kube_client, preemptor),
               timeout_s=60, what="the preemptor still unschedulable")
    assert get(kube_client, f"a-{node}") is not None
    assert not (get(kube_client, preemptor) or {})["spec"].get("nodeName")
