"""Priority and preemption for GPU slices on the real node (issue 29).

The whole chain as a cluster runs it: kube-scheduler + hami's extender decide and evict
(the Eviction API), the real kubelet stops the victims' containers in containerd and
deletes the pods, hami hands the freed slice to the preemptor, the kubelet's Allocate on
hami's device plugin starts it, and libvgpu on the stub driver enforces its slice on the
card the victim held. The stub's card is shared by every container of the node, as a
real GPU is: memory a victim's process still held would be missing on it.

Both cards are full (memory booked 14000 of 16384 MiB each), every pod holding memory:

* card 0: ``lo-big`` (low, 12000 MiB, holds 11000) and ``lo-small`` (low, 2000, holds 1000);
* card 1: ``lo-other`` (low, 8000, holds 4000) and ``hi-peer`` (high, 6000, holds 2000).

A high-priority 12000 MiB pod fits no card. Evicting ``lo-big`` alone makes room on card
0; no eviction on card 1 does (``hi-peer`` is never a victim, and 16384 - 6000 < 12000).
The minimal victim set is therefore exactly ``{lo-big}``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, codecs
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.resources.scheduling_v1 import PriorityClass
from prometheus_client.parser import text_string_to_metric_families

from hami.core.codec import decode_pod_devices
from hami.testing.controlplane import ControlPlaneError, wait_until
from hami.testing.gpubed import GpuBed
from hami.testing.gpupods import gpu_test_pod, stub_uuid

MiB = 1 << 20
LOW, HIGH = "rn-gpu-low", "rn-gpu-high"
CARD_MIB = 16384
SHOW_ENV = "env | grep -E '^(NVIDIA_VISIBLE_DEVICES|CUDA_DEVICE_MEMORY_LIMIT_0)=' | sort"

#: name -> (priority class, card index, booked MiB, MiB its process holds)
FILLERS = {
    "lo-big": (LOW, 0, 12000, 11000),
    "lo-small": (LOW, 0, 2000, 1000),
    "lo-other": (LOW, 1, 8000, 4000),
    "hi-peer": (HIGH, 1, 6000, 2000),
}
VICTIM = "lo-big"
#: The victim ignores SIGTERM (a process that checkpoints before it exits): its memory on
#: the card stays held until the kubelet kills it after this grace period. A preemptor
#: started before then finds the card short (11000 + 1000 + 12000 > 16384 MiB).
VICTIM_GRACE_S = 8


@pytest.fixture
def classes(bed: GpuBed, client: Any) -> Iterator[None]:
    """The PriorityClasses; afterwards the test's pods are stopped for real: deleted
    gracefully and waited for until their containers' tasks are gone (a forced deletion
    leaves the API at once while the process still holds its memory on the shared stub
    card, and the next test's pod would find the card short)."""
    for name, value in ((LOW, 100), (HIGH, 1000)):
        with contextlib.suppress(ApiError):
            client.create(codecs.from_dict({
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value}))
    yield
    ids = set()
    for pod in client.list(Pod, namespace="default"):
        ids |= {str(c.containerID).split("://", 1)[-1]
                for c in (pod.status.containerStatuses or []) if c.containerID}
        with contextlib.suppress(ApiError):
            client.delete(Pod, pod.metadata.name, namespace="default", grace_period=1)
    wait_until(lambda: not list(client.list(Pod, namespace="default"))
               and not ids & running_tasks(bed), timeout_s=60,
               what="the test's pods and their containers gone")
    for pdb in client.list(PodDisruptionBudget, namespace="default"):
        client.delete(PodDisruptionBudget, pdb.metadata.name, namespace="default")
    for name in (LOW, HIGH):
        with contextlib.suppress(ApiError):
            client.delete(PriorityClass, name)


def log_of(bed: GpuBed, pod: str) -> str:
    assert bed.node is not None
    return bed.node.container_log("default", pod, "c")


def lines(log: str, tag: str) -> list[list[int]]:
    """Numeric fields of vgtest's lines starting with ``tag``."""
    return [[int(x) for x in ln.split()[1:]] for ln in log.splitlines()
            if ln.split()[:1] == [tag]]


def env_of(log: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in log.splitlines()
                if "=" in ln and ln.split("=")[0].isupper())


def get(client: Any, name: str) -> Any | None:
    try:
        return client.get(Pod, name, namespace="default")
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise


def cards_of(pod: Any) -> list[tuple[str, int]]:
    """(uuid, booked MiB) of each card hami wrote down for the pod."""
    allocated = pod.metadata.annotations["hami.io/vgpu-devices-allocated"]
    return [(d.uuid, d.used_memory_mib) for c in decode_pod_devices(allocated) for d in c]


def container_id(pod: Any) -> str:
    (status,) = pod.status.containerStatuses
    return str(status.containerID).split("://", 1)[1]


def running_tasks(bed: GpuBed) -> set[str]:
    """IDs of the containers whose task runs in the node's containerd."""
    assert bed.node is not None
    return bed.node.running_task_ids()


def series(bed: GpuBed, family: str) -> dict[tuple[str, str], float]:
    """The monitor's per-container series: (pod, device_uuid) -> value."""
    out = {}
    for fam in text_string_to_metric_families(bed.monitor_metrics()):
        for s in fam.samples:
            if s.name == family:
                out[(s.labels["pod"], s.labels["device_uuid"])] = s.value
    return out


def events(client: Any, name: str, reason: str) -> list[str]:
    return [str(e.message) for e in client.list(Event, namespace="default",
                                                fields={"involvedObject.name": name})
            if e.reason == reason]


def holding_pod(name: str, priority_class: str, memory_mib: int, command: str,
                card: int | None = None, labels: dict[str, str] | None = None
                ) -> dict[str, Any]:
    annotations = {"nvidia.com/use-gpuuuid": stub_uuid(card)} if card is not None else {}
    manifest = gpu_test_pod(name, command, memory_mib=memory_mib, annotations=annotations)
    manifest["spec"]["priorityClassName"] = priority_class
    manifest["metadata"]["labels"] = dict(labels or {})
    return manifest


def wait_holding(bed: GpuBed, client: Any, name: str, word: str = "holding") -> Any:
    """Wait until the pod's container printed ``word`` (vgtest got there) and the kubelet
    reported it running (its container ID); return the pod."""
    def there() -> bool:
        pod = get(client, name)
        if pod is not None and pod.status and pod.status.phase in ("Succeeded", "Failed"):
            raise AssertionError(f"{name} ended: {pod.status}; log: {log_of(bed, name)!r}")
        statuses = (pod.status.containerStatuses or []) if pod and pod.status else []
        return (word in log_of(bed, name).split() and len(statuses) == 1
                and statuses[0].state.running is not None and bool(statuses[0].containerID))

    try:
        wait_until(there, timeout_s=120, what=f"{name} {word}")
    except ControlPlaneError as err:
        pod = get(client, name)
        raise AssertionError(f"{err}; status {pod.status if pod else None}; "
                             f"log: {log_of(bed, name)!r}") from None
    return get(client, name)


def fill(bed: GpuBed, client: Any, labels: dict[str, dict[str, str]] | None = None
         ) -> dict[str, Any]:
    """Start the fillers; return them running and holding their memory, by name."""
    for name, (cls, card, booked, held) in FILLERS.items():
        manifest = holding_pod(name, cls, booked, f"vgtest init alloc mem {held * MiB} 0 hold",
                               card=card, labels=(labels or {}).get(name))
        if name == VICTIM:  # slow to stop: its memory stays held until the SIGKILL
            manifest["spec"]["terminationGracePeriodSeconds"] = VICTIM_GRACE_S
            command = manifest["spec"]["containers"][0]["command"]
            command[-1] = "trap '' TERM; " + command[-1]
        client.create(codecs.from_dict(manifest))
    pods = {name: wait_holding(bed, client, name) for name in FILLERS}
    for name, (_, card, booked, _) in FILLERS.items():
        assert cards_of(pods[name]) == [(stub_uuid(card), booked)], name
    return pods


def booked_per_card(client: Any) -> dict[str, int]:
    """MiB hami booked on each card, from the annotations of the pods not finished."""
    out: dict[str, int] = {}
    for pod in client.list(Pod, namespace="default"):
        if pod.status and pod.status.phase in ("Succeeded", "Failed"):
            continue
        if "hami.io/vgpu-devices-allocated" in (pod.metadata.annotations or {}):
            for uuid, mib in cards_of(pod):
                out[uuid] = out.get(uuid, 0) + mib
    return out


PREEMPTOR_SCRIPT = (f"{SHOW_ENV}; vgtest init info alloc mem {12000 * MiB} 0 alloc mem 1 2 "
                    "info hold")


def test_victims_stop_and_the_preemptor_runs_with_its_limit_on_the_freed_card(
        bed: GpuBed, client: Any, classes: None) -> None:
    before = fill(bed, client)
    ids = {name: container_id(pod) for name, pod in before.items()}
    assert set(ids.values()) <= running_tasks(bed)
    wait_until(lambda: {(n, stub_uuid(c)) for n, (_, c, _, _) in FILLERS.items()}
               <= set(series(bed, "hami_vgpu_memory_used_bytes")), timeout_s=30,
               what="the monitor's series of every filler")
    used = series(bed, "hami_vgpu_memory_used_bytes")
    assert used[(VICTIM, stub_uuid(0))] >= 11000 * MiB

    client.create(codecs.from_dict(holding_pod("hi", HIGH, 12000, PREEMPTOR_SCRIPT)))
    pod = wait_holding(bed, client, "hi")
    log = log_of(bed, "hi")

    # the victim: evicted, its container stopped before the preemptor ran; the kubelet
    # then deletes its pod (once its volumes are cleaned up)
    assert ids[VICTIM] not in running_tasks(bed)
    victim = get(client, VICTIM)
    if victim is not None:  # still in the API: terminated, before the preemptor started
        assert victim.metadata.uid == before[VICTIM].metadata.uid
        assert victim.metadata.deletionTimestamp is not None, victim.status
        assert victim.status.phase == "Failed", victim.status
        (ended,) = [c.state.terminated for c in victim.status.containerStatuses]
        assert ended is not None, victim.status
        assert ended.finishedAt <= pod.status.containerStatuses[0].state.running.startedAt
    wait_until(lambda: get(client, VICTIM) is None, timeout_s=60, what=f"{VICTIM} deleted")
    # hami posts its events from a queue: wait for them
    wait_until(lambda: bool(events(client, VICTIM, "Preempted")
                            and events(client, "hi", "Preempting")), timeout_s=30,
               what="the Preempted and Preempting events")
    preempted = events(client, VICTIM, "Preempted")
    assert preempted and stub_uuid(0) in preempted[0] and "default/hi" in preempted[0]
    assert any(stub_uuid(0) in m for m in events(client, "hi", "Preempting"))
    # nobody else: the same pods, their containers still running
    tasks = running_tasks(bed)
    for name in set(FILLERS) - {VICTIM}:
        now = get(client, name)
        assert now is not None and now.metadata.uid == before[name].metadata.uid, name
        assert now.metadata.deletionTimestamp is None, name
        assert now.status.phase == "Running" and ids[name] in tasks, name

    # the preemptor: on the victim's card, its own limit in libvgpu
    assert pod.spec.nodeName == bed.node_name
    assert cards_of(pod) == [(stub_uuid(0), 12000)]
    env = env_of(log)
    assert env["NVIDIA_VISIBLE_DEVICES"] == stub_uuid(0), log
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "12000m", log
    info = lines(log, "info")
    # cuMemGetInfo: the slice; all 12000 MiB allocated on the stub card (which the victim's
    # 11000 MiB would have left short: 11000 + 1000 + 12000 > 16384), one byte more is OOM
    assert info[0][:2] == [12000 * MiB, 12000 * MiB], log
    assert info[1][:2] == [0, 12000 * MiB], log
    assert f"alloc mem {12000 * MiB} -> 0" in log and "alloc mem 1 -> 2" in log, log

    # the monitor: the victim's region usage is gone, the preemptor's shows on card 0
    wait_until(lambda: (VICTIM, stub_uuid(0)) not in series(bed, "hami_vgpu_memory_used_bytes")
               and ("hi", stub_uuid(0)) in series(bed, "hami_vgpu_memory_used_bytes"),
               timeout_s=30, what="the monitor dropped the victim and shows the preemptor")
    used = series(bed, "hami_vgpu_memory_used_bytes")
    limits = series(bed, "hami_vgpu_memory_limit_bytes")
    assert used[("hi", stub_uuid(0))] >= 12000 * MiB
    assert limits[("hi", stub_uuid(0))] == 12000 * MiB
    # no card booked over its memory: by hami's annotations and by the limits the
    # containers run with
    booked = booked_per_card(client)
    assert booked == {stub_uuid(0): 14000, stub_uuid(1): 14000}, booked
    for card in (stub_uuid(0), stub_uuid(1)):
        assert sum(v for (_, u), v in limits.items() if u == card) <= CARD_MIB * MiB


def test_a_budget_keeps_the_victim_running(bed: GpuBed, client: Any, classes: None) -> None:
    """A PodDisruptionBudget covering the only useful victim: the Eviction API refuses
    (no controller computes the budget here, so it allows nothing), hami says why on the
    preemptor and evicts nothing else; the victim's container keeps running."""
    before = fill(bed, client, labels={VICTIM: {"app": "kept"}})
    ids = {name: container_id(pod) for name, pod in before.items()}
    client.create(codecs.from_dict({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep", "namespace": "default"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "kept"}}}}))
    client.create(codecs.from_dict(holding_pod("hi", HIGH, 12000, PREEMPTOR_SCRIPT)))
    wait_until(lambda: bool(events(client, "hi", "PreemptionRefused")), timeout_s=90,
               what="PreemptionRefused on the preemptor")
    (message, *_) = events(client, "hi", "PreemptionRefused")
    assert f"default/{VICTIM}" in message and "disruption budget" in message, message
    tasks = running_tasks(bed)
    for name in FILLERS:
        now = get(client, name)
        assert now is not None and now.metadata.uid == before[name].metadata.uid, name
        assert now.metadata.deletionTimestamp is None and ids[name] in tasks, name
    hi = get(client, "hi")
    assert hi is not None and not hi.spec.nodeName
    assert booked_per_card(client) == {stub_uuid(0): 14000, stub_uuid(1): 14000}
