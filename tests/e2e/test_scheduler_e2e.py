"""``hami scheduler`` end to end on the real control plane (etcd, kube-apiserver,
kube-scheduler built from the pinned Kubernetes release).

The scheduler runs as its own process (HTTPS, webhook registered through a
MutatingWebhookConfiguration with our CA bundle); a kube-scheduler with profile
``hami-scheduler`` calls its ``/filter`` and ``/bind`` (HAMi chart extender settings).
No kubelet runs, so :class:`FakeAllocator` plays the device plugin's part of the
protocol (``bind-phase=success`` and node-lock release). Each test uses its own nodes
(label ``e2e-group``) and pins its pods to them with a nodeSelector.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, codecs
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType

from hami.core.clusterfacts import BINDING_LABELS_MINOR
from hami.core.codec import decode_node_devices, decode_pod_devices
from hami.devices.registry import make_config
from hami.offline import schedule
from hami.testing.controlplane import (
    KUBERNETES_VERSION,
    ControlPlane,
    SchedulerHandle,
    bind_pod,
    wait_until,
)
from hami.testing.gpupods import wait_webhook_serving
from hami.testing.scheduler_config import ExtenderConfig

from .hami_harness import (
    LATE_ALLOCATE,
    FakeAllocator,
    HamiProcess,
    ReadyForwarder,
    Tls,
    gpu_pod,
    make_gpu_node,
    unique,
    webhook_configuration,
)

pytestmark = pytest.mark.e2e

GROUP = "e2e-group"


# ------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hami-scheduler")


@pytest.fixture(scope="module")
def tls(workdir: Path) -> Tls:
    return Tls(workdir / "tls")


@pytest.fixture(scope="module")
def hami(control_plane: ControlPlane, tls: Tls, workdir: Path) -> Iterator[HamiProcess]:
    # the webhook refuses GPU pods of other schedulers unless they are allowed: this
    # module's HA replicas and a "nobody" that never schedules
    proc = HamiProcess(control_plane, tls, workdir,
                       args=["--other-gpu-schedulers=hami-ha,nobody"]).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def allocator(control_plane: ControlPlane) -> Iterator[FakeAllocator]:
    fake = FakeAllocator(control_plane).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def kube_scheduler(control_plane: ControlPlane, hami: HamiProcess,
                   allocator: FakeAllocator) -> Iterator[SchedulerHandle]:
    handle = control_plane.start_scheduler(scheduler_name="hami-scheduler",
                                           extender=ExtenderConfig(hami.url))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def webhook(kube_client: Any, hami: HamiProcess, tls: Tls) -> Iterator[str]:
    name = unique("hami-webhook")
    kube_client.create(codecs.from_dict(webhook_configuration(name, hami.url, tls.ca_pem)))
    wait_webhook_serving(kube_client)
    yield name
    kube_client.delete(MutatingWebhookConfiguration, name)


@pytest.fixture
def group(kube_client: Any) -> Iterator[str]:
    """A label value for this test's nodes and pods; its pods are deleted afterwards."""
    value = unique("g")
    yield value
    for pod in kube_client.list(Pod, namespace="default", labels={GROUP: value}):
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, pod.metadata.name, namespace="default", grace_period=0)


# -------------------------------------------------------------------- helpers
def nodes(client: Any, group: str, count: int, prefix: str, **kw: Any) -> list[str]:
    names = [f"{prefix}-{group}-{i:02d}" for i in range(count)]
    for name in names:
        make_gpu_node(client, name, labels={GROUP: group}, **kw)
    return names


def pod_in(group: str, name: str, **kw: Any) -> dict[str, Any]:
    kw.setdefault("scheduler_name", "hami-scheduler")
    pod = gpu_pod(name, node_selector=kw.pop("node_selector", {GROUP: group}), **kw)
    pod["metadata"]["labels"] = {GROUP: group}
    return pod


def create(client: Any, pod: dict[str, Any]) -> Any:
    return client.create(codecs.from_dict(pod))


def get(client: Any, name: str) -> dict[str, Any]:
    return client.get(Pod, name, namespace="default").to_dict()


def annotations(pod: dict[str, Any]) -> dict[str, str]:
    return pod["metadata"].get("annotations") or {}


def unschedulable_message(pod: dict[str, Any]) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message", ""))
    return None


def wait_bound(client: Any, name: str, timeout_s: float = 60) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def bound() -> bool:
        seen["pod"] = get(client, name)
        return bool(seen["pod"]["spec"].get("nodeName"))

    wait_until(bound, timeout_s=timeout_s, what=f"pod {name} bound")
    return seen["pod"]


def wait_settled(client: Any, group: str, expected: int, timeout_s: float) -> list[dict[str, Any]]:
    """Wait until all ``expected`` pods of the group are bound or Unschedulable."""
    seen: dict[str, list[dict[str, Any]]] = {}

    def settled() -> bool:
        pods = [p.to_dict() for p in client.list(Pod, namespace="default", labels={GROUP: group})]
        seen["pods"] = pods
        done = [p for p in pods if p["spec"].get("nodeName") or unschedulable_message(p)]
        return len(pods) == expected and len(done) == expected

    wait_until(settled, timeout_s=timeout_s, what=f"{expected} pods of {group} settled")
    return seen["pods"]


def check_capacity(client: Any, node_names: list[str], pods: list[dict[str, Any]]) -> int:
    """No GPU over its memory, cores or split count, from the final annotations; returns
    how many pods hold GPUs. Every pod holding GPUs that is bound sits on its node."""
    devices = {}
    for name in node_names:
        node = client.get(Node, name).to_dict()
        for dev in decode_node_devices(node["metadata"]["annotations"]["hami.io/node-nvidia-register"]):
            devices[dev.uuid] = dev
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    holders = 0
    for pod in pods:
        ann = annotations(pod)
        if "hami.io/vgpu-devices-allocated" not in ann:
            continue
        holders += 1
        if pod["spec"].get("nodeName"):
            assert pod["spec"]["nodeName"] == ann["hami.io/vgpu-node"]
        for container in decode_pod_devices(ann["hami.io/vgpu-devices-allocated"]):
            for dev in container:
                assert dev.uuid in devices and dev.uuid.startswith(f"GPU-{ann['hami.io/vgpu-node']}-")
                u = used[dev.uuid]
                u[0] += dev.used_memory_mib
                u[1] += dev.used_cores_percent
                u[2] += 1
    for uuid, (mem, cores, count) in used.items():
        dev = devices[uuid]
        assert mem <= dev.memory_mib, f"{uuid}: {mem} MiB > {dev.memory_mib}"
        assert cores <= dev.cores_percent, f"{uuid}: {cores}% cores > {dev.cores_percent}"
        assert count <= dev.split_count, f"{uuid}: {count} tasks > {dev.split_count}"
    return holders


# ---------------------------------------------------------------------- webhook
def test_webhook_sets_scheduler_and_normalises_limits(kube_client: Any, webhook: str,
                                                      group: str) -> None:
    pod = pod_in(group, unique("wh"), node_selector={GROUP: "nowhere"}, scheduler_name=None)
    created = create(kube_client, pod).to_dict()
    assert created["spec"]["schedulerName"] == "hami-scheduler"
    limits = created["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}
    mem_only = pod_in(group, unique("wh"), gpus=0, memory_mib=3000,
                      node_selector={GROUP: "nowhere"}, scheduler_name=None)
    created = create(kube_client, mem_only).to_dict()
    assert created["spec"]["schedulerName"] == "hami-scheduler"
    assert created["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpumem": "3k", "nvidia.com/gpu": "1"}  # count added; memory set: shared


def test_webhook_refuses_privileged_gpu_pod(kube_client: Any, webhook: str, group: str) -> None:
    pod = pod_in(group, unique("priv"), privileged=True, scheduler_name=None)
    with pytest.raises(ApiError) as err:
        create(kube_client, pod)
    assert "container main is privileged" in err.value.status.message
    assert "denied the request" in err.value.status.message


def test_webhook_removes_allocation_annotations_a_pod_creator_wrote(kube_client: Any, webhook: str,
                                                                   group: str) -> None:
    forged = {"hami.io/vgpu-node": "gpu-x", "hami.io/bind-phase": "allocating",
              "hami.io/vgpu-devices-to-allocate": "GPU-x,NVIDIA,81920,100:;",
              "hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,81920,100:;", "team": "kept"}
    for scheduler in (None, "other-scheduler"):  # hami's pod, and one of another scheduler
        pod = pod_in(group, unique("forged"), gpus=0, node_selector={GROUP: "nowhere"},
                     scheduler_name=scheduler, annotations=forged)
        pod["metadata"]["labels"]["hami.io/vgpu-node"] = "gpu-x"
        created = create(kube_client, pod).to_dict()
        assert annotations(created) == {"team": "kept"}
        assert "hami.io/vgpu-node" not in created["metadata"]["labels"]


def test_webhook_leaves_pod_without_gpu_untouched(kube_client: Any, webhook: str,
                                                  group: str) -> None:
    pod = pod_in(group, unique("plain"), gpus=0, node_selector={GROUP: "nowhere"},
                 scheduler_name=None)
    created = create(kube_client, pod).to_dict()
    assert created["spec"]["schedulerName"] == "default-scheduler"
    assert created["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "1m"}}
    assert not annotations(created)


def test_gpu_pod_that_skipped_the_webhook_is_refused_by_filter(kube_client: Any,
                                                               kube_scheduler: Any,
                                                               webhook: str, group: str) -> None:
    """Issue 12 §3: a hostPID GPU pod that never met the webhook (its namespace is
    excluded) and names hami's scheduler itself went through /filter and /bind. (This
    apiserver refuses privileged pods itself, so the pod uses the other rules.)"""
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace

    from hami.testing.controlplane import ensure_namespace

    nodes(kube_client, group, 1, "bypass")
    namespace = unique("skipped")
    kube_client.create(Namespace(metadata=ObjectMeta(name=namespace,
                                                     labels={"hami.io/webhook": "ignore"})))
    ensure_namespace(kube_client, namespace)
    pod = pod_in(group, unique("evil"))
    pod["metadata"]["namespace"] = namespace
    pod["spec"]["hostPID"] = True
    pod["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "value": "/tmp/mine.so"}]
    name = pod["metadata"]["name"]
    create(kube_client, pod)
    try:
        def refused() -> bool:
            return any("spec.hostPID is true" in (e.message or "") and
                       "container main: env LD_PRELOAD is reserved" in (e.message or "")
                       for e in kube_client.list(Event, namespace=namespace,
                                                 fields={"involvedObject.name": name})
                       if e.reason == "FilteringFailed")

        wait_until(refused, timeout_s=60, what="FilteringFailed naming the rules")
        live = kube_client.get(Pod, name, namespace=namespace).to_dict()
        assert not live["spec"].get("nodeName")
        assert "hami.io/vgpu-node" not in annotations(live)
    finally:
        kube_client.delete(Pod, name, namespace=namespace, grace_period=0)


# -------------------------------------------------------------------- scheduling
def wait_registered(hami: HamiProcess, names: list[str], timeout_s: float = 60) -> None:
    """Until hami's ledger holds every node of ``names`` (its per-GPU limit series name
    them): a decision made before that sees fewer candidate nodes than the offline one."""
    def seen() -> bool:
        text = hami.metrics()
        return all(f'node="{n}"' in text for n in names)

    wait_until(seen, timeout_s=timeout_s, what=f"hami registered {names}")


def test_pods_bound_with_the_offline_annotations(kube_client: Any, kube_scheduler: Any,
                                                 webhook: str, group: str,
                                                 hami: HamiProcess) -> None:
    names = nodes(kube_client, group, 3, "match")
    wait_registered(hami, names)
    specs = [dict(memory_mib=20000), dict(memory_mib=6000, cores=30), dict(gpus=2, memory_mib=1000),
             dict(memory_mib=12000, cores=50), dict(), dict(memory_mib=8000),
             dict(gpus=3, memory_mib=2000, cores=10), dict(memory_mib=24000)]
    pods = [pod_in(group, f"m{i}-{group}", **kw) for i, kw in enumerate(specs)]
    for pod in pods:  # one at a time: each decision sees the previous ones, as offline
        create(kube_client, pod)
        wait_bound(kube_client, pod["metadata"]["name"])
    node_objs = sorted((kube_client.get(Node, n).to_dict() for n in names),
                       key=lambda n: n["metadata"]["name"])
    for n in node_objs:
        n["kind"], n["apiVersion"] = "Node", "v1"
    offline = schedule([*node_objs, *pods], make_config())
    for pod, expected in zip(pods, offline["pods"], strict=True):
        live = get(kube_client, pod["metadata"]["name"])
        assert live["spec"]["nodeName"] == expected["node"]
        ann = annotations(live)
        assert {k: ann.get(k) for k in expected["annotations"]} == expected["annotations"]
        assert live["metadata"]["labels"]["hami.io/vgpu-node"] == expected["node"]
        assert ann["hami.io/bind-phase"] in ("allocating", "success")


def test_unschedulable_pod_has_a_readable_reason(kube_client: Any, kube_scheduler: Any,
                                                 group: str) -> None:
    nodes(kube_client, group, 2, "small")
    name = unique("huge")
    create(kube_client, pod_in(group, name, memory_mib=999999))
    seen: dict[str, str] = {}

    def unschedulable() -> bool:
        msg = unschedulable_message(get(kube_client, name))
        if msg:
            seen["msg"] = msg
        return bool(msg)

    wait_until(unschedulable, timeout_s=60, what=f"{name} Unschedulable")
    assert "4/4 CardInsufficientMemory" in seen["msg"], seen["msg"]
    events = [e for e in kube_client.list(Event, namespace="default",
                                          fields={"involvedObject.name": name})]
    wait_until(lambda: any(e.reason == "FilteringFailed" for e in kube_client.list(
        Event, namespace="default", fields={"involvedObject.name": name})),
        timeout_s=20, what="FilteringFailed event")
    del events


def test_200_pods_at_once_never_overcommit(kube_client: Any, kube_scheduler: Any,
                                           group: str, hami: HamiProcess) -> None:
    names = nodes(kube_client, group, 10, "load")
    rng = random.Random(7)
    pods = []
    for i in range(200):
        kw: dict[str, Any] = {"memory_mib": rng.choice([1000, 2000, 4000, 6000, 8000, 12000])}
        if rng.random() < 0.5:
            kw["cores"] = rng.choice([5, 10, 20, 30, 50])
        if rng.random() < 0.1:
            kw["gpus"] = 2
        pods.append(pod_in(group, f"l{i:03d}-{group}", **kw))
    started = time.monotonic()
    objs = [codecs.from_dict(p) for p in pods]  # msgspec's first decodes are not thread-safe
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(kube_client.create, objs))
    final = wait_settled(kube_client, group, 200, timeout_s=300)
    elapsed = time.monotonic() - started
    holders = check_capacity(kube_client, names, final)
    bound = sum(1 for p in final if p["spec"].get("nodeName"))
    assert bound >= 100 and holders >= bound
    print(f"200 pods on 10x4 GPUs: {bound} bound, {200 - bound} unschedulable, {elapsed:.1f}s")


def test_nodes_in_cdi_mode_bind_200_pods_without_a_node_lock(
        kube_client: Any, kube_scheduler: Any, group: str, hami: HamiProcess,
        control_plane: ControlPlane) -> None:
    """Nodes whose device plugin advertises allocate mode ``cdi``: no node lock is ever
    written on them, binds on one node overlap, and still no GPU is overcommitted."""
    names = nodes(kube_client, group, 10, "cdi",
                  annotations={"hami.io/node-allocate-mode": "cdi"})
    locks_seen: list[tuple[str, str]] = []
    watching = threading.Event()
    stop = threading.Event()

    def watch_locks() -> None:
        client = control_plane.client()
        version: str | None = None  # each renewal resumes where the last one ended
        while not stop.is_set():
            try:
                for _, node in client.watch(Node, labels={GROUP: group}, server_timeout=5,
                                            resource_version=version):
                    watching.set()
                    version = node.metadata.resourceVersion
                    lock = (node.metadata.annotations or {}).get("hami.io/mutex.lock")
                    if lock:
                        locks_seen.append((node.metadata.name, lock))
                    if stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - e.g. 410 Gone: start over from now
                version = None

    watcher = threading.Thread(target=watch_locks, daemon=True)
    watcher.start()
    assert watching.wait(30), "the Node watch never delivered a Node"
    rng = random.Random(11)
    pods = []
    for i in range(200):
        kw: dict[str, Any] = {"memory_mib": rng.choice([1000, 2000, 4000, 6000, 8000, 12000])}
        if rng.random() < 0.5:
            kw["cores"] = rng.choice([5, 10, 20, 30, 50])
        if rng.random() < 0.1:
            kw["gpus"] = 2
        pods.append(pod_in(group, f"f{i:03d}-{group}", **kw))
    objs = [codecs.from_dict(p) for p in pods]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(kube_client.create, objs))
    final = wait_settled(kube_client, group, 200, timeout_s=300)
    stop.set()
    holders = check_capacity(kube_client, names, final)
    bound = sum(1 for p in final if p["spec"].get("nodeName"))
    assert bound >= 100 and holders >= bound
    assert locks_seen == []
    for name in names:
        assert "hami.io/mutex.lock" not in (kube_client.get(Node, name).metadata.annotations or {})


def test_a_bind_to_a_node_in_cdi_mode_writes_the_allocation_with_the_binding(
        kube_client: Any, kube_scheduler: Any, group: str, hami: HamiProcess) -> None:
    """Issue 15: two pod writes fewer per pod on nodes in mode ``cdi``. The pod's history
    (a watch from its creation) shows no write between the create and the Binding, and
    the Binding's write brings the allocation, the label and what the device plugin's
    success patch wrote (``bind-phase=success``, the to-allocate string emptied): the
    allocation is final when it lands, and the plugin writes nothing after it."""
    (node,) = nodes(kube_client, group, 1, "cdi1",
                    annotations={"hami.io/node-allocate-mode": "cdi"})
    pod = pod_in(group, f"w-{group}", memory_mib=1000)
    pod["metadata"]["labels"][LATE_ALLOCATE] = "true"  # the fake plugin leaves it alone
    created = kube_client.create(codecs.from_dict(pod))
    name = created.metadata.name
    wait_bound(kube_client, name)
    kind, first = next(iter(kube_client.watch(
        Pod, namespace="default", fields={"metadata.name": name},
        resource_version=created.metadata.resourceVersion)))
    ann, labels = first.metadata.annotations or {}, first.metadata.labels or {}
    assert (kind, first.spec.nodeName) == ("MODIFIED", node), "a pod write before the Binding"
    assert ann["hami.io/vgpu-node"] == node
    if int(KUBERNETES_VERSION.split(".")[1]) >= BINDING_LABELS_MINOR:
        assert labels["hami.io/vgpu-node"] == node
    else:  # the API server dropped the Binding's label; hami's patch right after brings it
        assert "hami.io/vgpu-node" not in labels
        wait_until(lambda: (kube_client.get(Pod, name, namespace="default").metadata.labels
                            or {}).get("hami.io/vgpu-node") == node,
                   timeout_s=30, what="the scheduler's label patch after the Binding")
    assert ann["hami.io/bind-phase"] == "success" and ann["hami.io/bind-time"]
    assert decode_pod_devices(ann["hami.io/vgpu-devices-allocated"])[0][0].used_memory_mib == 1000
    assert ann["hami.io/vgpu-devices-to-allocate"] == ";"


def test_sigkill_while_pods_stream_in(kube_client: Any, kube_scheduler: Any, group: str,
                                      hami: HamiProcess) -> None:
    names = nodes(kube_client, group, 4, "crash")
    total = 80
    created = threading.Event()

    def stream() -> None:
        for i in range(total):
            pod = pod_in(group, f"c{i:02d}-{group}", memory_mib=3000, cores=10 if i % 2 else None)
            for _ in range(200):  # the webhook is down while the scheduler restarts
                try:
                    create(kube_client, pod)
                    break
                except ApiError:
                    time.sleep(0.1)
            time.sleep(0.04)
        created.set()

    thread = threading.Thread(target=stream)
    thread.start()
    wait_until(lambda: hami.status().get("counters", {}).get("binds", 0) >= 5, timeout_s=60,
               what="some binds before the kill")
    hami.kill()
    time.sleep(1.0)
    hami.start()
    thread.join()
    final = wait_settled(kube_client, group, total, timeout_s=240)
    check_capacity(kube_client, names, final)
    bound = [p for p in final if p["spec"].get("nodeName")]
    # 4 nodes x 4 GPUs x 24 GiB hold all 80 pods of 3000 MiB (and 10 slots each).
    assert len(bound) == total


def test_terminating_pod_still_holds_its_gpu_after_a_restart(kube_client: Any, kube_scheduler: Any,
                                                             group: str, hami: HamiProcess) -> None:
    # Issue 11 item 3: one 24576 MiB card; a bound pod with 20000 MiB is deleted with a long
    # grace period (no kubelet here, so it stays Terminating). A restarted scheduler must
    # still count it: a 10000 MiB pod does not fit the card.
    nodes(kube_client, group, 1, "term", gpus=1)
    old = unique("old")
    create(kube_client, pod_in(group, old, memory_mib=20000))
    wait_bound(kube_client, old)
    kube_client.delete(Pod, old, namespace="default", grace_period=3600)
    wait_until(lambda: bool(get(kube_client, old)["metadata"].get("deletionTimestamp")),
               timeout_s=10, what=f"{old} Terminating")
    hami.kill()
    hami.start()
    new = unique("new")
    create(kube_client, pod_in(group, new, memory_mib=10000))
    seen: dict[str, str] = {}

    def unschedulable() -> bool:
        seen["msg"] = unschedulable_message(get(kube_client, new)) or ""
        return bool(seen["msg"])

    wait_until(unschedulable, timeout_s=150, what=f"{new} Unschedulable")
    assert "CardInsufficientMemory" in seen["msg"], seen["msg"]
    assert not get(kube_client, new)["spec"].get("nodeName")
    # Once the Terminating pod is gone its card is free again.
    kube_client.delete(Pod, old, namespace="default", grace_period=0)
    assert wait_bound(kube_client, new, timeout_s=180)["spec"]["nodeName"]


# ---------------------------------------------------------------- field cases
def _local(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%d %H:%M:%S")


def test_b01_b02_lock_owner_exact_and_dangling_lock(kube_client: Any, kube_scheduler: Any,
                                                    group: str) -> None:
    holder = pod_in(group, "worker-123", node_selector={GROUP: "nowhere"})
    holder["spec"]["schedulerName"] = "nobody"  # exists, never scheduled
    create(kube_client, holder)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    [name] = nodes(kube_client, group, 1, "b01",
                   annotations={"hami.io/mutex.lock": f"{now},default,worker-123"})
    create(kube_client, pod_in(group, "worker", memory_mib=4000))
    time.sleep(5)
    # B01: worker's failed/waiting bind never released worker-123's lock.
    lock = kube_client.get(Node, name).metadata.annotations["hami.io/mutex.lock"]
    assert lock == f"{now},default,worker-123"
    assert not get(kube_client, "worker")["spec"].get("nodeName")
    # B02: the holder is deleted before Allocate: the lock is dangling and taken over.
    kube_client.delete(Pod, "worker-123", namespace="default", grace_period=0)
    # taken over, not waited out: the lock (written at `now`) would expire after
    # --node-lock-timeout (5m); worker binds at its next bind retry (kube-scheduler's
    # backoff, at most 10 s) well within 2 min, also on a loaded machine
    wait_bound(kube_client, "worker", timeout_s=120)


def test_b02_lock_of_a_deleted_pod_is_taken_over_at_once(kube_client: Any, kube_scheduler: Any,
                                                         group: str) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    nodes(kube_client, group, 1, "b02", annotations={"hami.io/mutex.lock": f"{now},ns1,app-1"})
    name = unique("app-2")
    create(kube_client, pod_in(group, name, memory_mib=8000))
    wait_bound(kube_client, name, timeout_s=120)
    # at once: its first bind took the lock over, none failed waiting for it (asserted
    # without a wall-clock threshold, which a loaded machine could cross)
    failed = [e.message for e in kube_client.list(Event, namespace="default",
                                                  fields={"involvedObject.name": name})
              if e.reason == "BindingFailed"]
    assert failed == [], failed


def _late_owner(client: Any, group: str, node: str, age: timedelta) -> tuple[str, str]:
    """A pod bound to ``node`` whose Allocate has not come (bind-phase allocating, left
    alone by the FakeAllocator), holding the node lock written ``age`` ago. It is made the
    way hami's Bind leaves a pod (the webhook removes such annotations at creation, and a
    GPU pod with a node is refused): created for another scheduler, bound, annotated."""
    owner = unique("pod-a")
    pod = pod_in(group, owner, memory_mib=1000, node_selector={GROUP: "nowhere"})
    pod["metadata"]["labels"][LATE_ALLOCATE] = "true"
    pod["spec"]["schedulerName"] = "nobody"  # kube-scheduler leaves it alone
    create(client, pod)
    bind_pod(client, owner, "default", node)
    client.patch(Pod, owner, {"metadata": {"annotations": {
        "hami.io/vgpu-node": node, "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": str(int(time.time() - age.total_seconds()))}}},
        namespace="default", patch_type=PatchType.MERGE)
    lock = f"{(datetime.now(UTC) - age).strftime('%Y-%m-%dT%H:%M:%SZ')},default,{owner}"
    client.patch(Node, node, {"metadata": {"annotations": {"hami.io/mutex.lock": lock}}},
                 patch_type=PatchType.MERGE)
    return owner, lock


def test_expired_lock_is_kept_while_its_owner_waits_for_allocate(
        kube_client: Any, kube_scheduler: Any, group: str) -> None:
    """Issue 11 item 7: pod A is bound, its Allocate is late and its lock is past
    --node-lock-timeout (5m). Pod B's bind must not take the lock over (the device plugin
    could then serve A with B's limits): it fails with contention until A's bind-phase
    becomes success, or A is deleted; then B binds."""
    [name] = nodes(kube_client, group, 1, "late")
    owner, lock = _late_owner(kube_client, group, name, timedelta(minutes=10))
    b = unique("pod-b")
    create(kube_client, pod_in(group, b, memory_mib=3000))

    def refused() -> bool:
        return any(e.reason == "BindingFailed" and "node lock contention" in (e.message or "")
                   for e in kube_client.list(Event, namespace="default",
                                             fields={"involvedObject.name": b}))

    wait_until(refused, timeout_s=60, what=f"{b} refused with node lock contention")
    assert kube_client.get(Node, name).metadata.annotations["hami.io/mutex.lock"] == lock
    assert not get(kube_client, b)["spec"].get("nodeName")
    # A's Allocate comes at last (the device plugin writes success; its lock is not
    # released here, as if the plugin died right after): B takes the lock over.
    kube_client.patch(Pod, owner, {"metadata": {"annotations": {
        "hami.io/bind-phase": "success"}}}, namespace="default", patch_type=PatchType.MERGE)
    assert wait_bound(kube_client, b, timeout_s=60)["spec"]["nodeName"] == name

    # Second round on the same node: the waiting owner is deleted instead.
    wait_until(lambda: "hami.io/mutex.lock" not in (
        kube_client.get(Node, name).metadata.annotations or {}), timeout_s=20,
        what="B's lock released by the allocator")
    owner2, lock2 = _late_owner(kube_client, group, name, timedelta(minutes=10))
    c = unique("pod-c")
    create(kube_client, pod_in(group, c, memory_mib=2000))
    time.sleep(6)
    assert kube_client.get(Node, name).metadata.annotations["hami.io/mutex.lock"] == lock2
    assert not get(kube_client, c)["spec"].get("nodeName")
    kube_client.delete(Pod, owner2, namespace="default", grace_period=0)
    assert wait_bound(kube_client, c, timeout_s=60)["spec"]["nodeName"] == name


def test_b20_deleted_handshake_node_comes_back(kube_client: Any, kube_scheduler: Any,
                                               group: str) -> None:
    old = _local(datetime.now() - timedelta(minutes=10))
    [back] = nodes(kube_client, group, 1, "b20", annotations={"hami.io/node-handshake": f"Deleted_{old}"})
    fresh = _local(datetime.now())
    [out] = nodes(kube_client, f"{group}-x", 1, "b20x",
                  annotations={"hami.io/node-handshake": f"Deleted_{fresh}"})
    name = unique("p")
    create(kube_client, pod_in(group, name, memory_mib=4000))
    assert wait_bound(kube_client, name)["spec"]["nodeName"] == back
    handshake = kube_client.get(Node, back).metadata.annotations["hami.io/node-handshake"]
    assert handshake.startswith("Requesting_")
    # Variant: a Deleted_ mark younger than the cooldown keeps the node out for now.
    stuck = unique("q")
    pod = pod_in(group, stuck, memory_mib=4000, node_selector={GROUP: f"{group}-x"})
    create(kube_client, pod)
    wait_until(lambda: "node unregistered" in (unschedulable_message(get(kube_client, stuck)) or ""),
               timeout_s=60, what="node unregistered")
    del out


def test_b25_node_that_stops_sharing_gets_no_vgpu_pods(kube_client: Any, kube_scheduler: Any,
                                                       group: str) -> None:
    [name] = nodes(kube_client, group, 1, "b25", gpus=1, memory_mib=16384)
    first = unique("share")
    create(kube_client, pod_in(group, first, memory_mib=4000))
    wait_bound(kube_client, first)
    # The sharing device plugin is uninstalled: its registration goes away.
    kube_client.patch(Node, name, {"metadata": {"annotations": {
        "hami.io/node-nvidia-register": None}}}, patch_type=PatchType.MERGE)
    second = unique("share")
    create(kube_client, pod_in(group, second, memory_mib=4000))
    wait_until(lambda: "node unregistered" in (unschedulable_message(get(kube_client, second)) or ""),
               timeout_s=60, what="node unregistered")
    assert not get(kube_client, second)["spec"].get("nodeName")


# --------------------------------------------------------------------- metrics
def test_metrics_carry_hami_names_and_latency_histograms(kube_client: Any, hami: HamiProcess,
                                                         kube_scheduler: Any, group: str) -> None:
    [name] = nodes(kube_client, group, 1, "metrics")
    pod = unique("m")
    create(kube_client, pod_in(group, pod, memory_mib=3000, cores=20))
    wait_bound(kube_client, pod)
    text = hami.metrics()
    for metric in ("hami_build_info", "hami_gpu_memory_limit_bytes", "hami_gpu_core_limit_ratio",
                   "hami_gpu_memory_allocated_bytes", "hami_gpu_shared_count",
                   "hami_gpu_core_allocated_ratio", "hami_node_gpu_overview",
                   "hami_node_gpu_memory_allocated_ratio", "hami_vgpu_memory_allocated_bytes",
                   "hami_vgpu_core_allocated_ratio"):
        assert f"\n# TYPE {metric} gauge" in text, metric
    for metric in ("hami_scheduler_filter_duration_seconds", "hami_scheduler_bind_duration_seconds"):
        assert f"\n# TYPE {metric} histogram" in text, metric
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    uuid = f"GPU-{name}-3"
    assert samples[("hami_vgpu_memory_allocated_bytes", tuple(sorted({
        "namespace": "default", "node": name, "pod": pod, "container_index": "0",
        "device_uuid": uuid, "zone": "vGPU"}.items())))] == 3000 * 2**20
    assert samples[("hami_gpu_shared_count", tuple(sorted({
        "node": name, "device_uuid": uuid, "device_index": "3", "device_type": "NVIDIA-A10",
        "zone": "vGPU"}.items())))] == 1


# ----------------------------------------------------------- leader election
def test_two_replicas_leader_killed_other_takes_over(control_plane: ControlPlane, tls: Tls,
                                                     workdir: Path, kube_client: Any,
                                                     allocator: FakeAllocator,
                                                     group: str) -> None:
    nodes(kube_client, group, 2, "ha")
    lease = unique("hami-ha")
    args = ["--scheduler-name=hami-ha", "--leader-elect",
            f"--leader-elect-resource-name={lease}", "--leader-elect-resource-namespace=default",
            "--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s",
            "--leader-elect-retry-period=500ms"]
    replicas = [HamiProcess(control_plane, tls, workdir, args=args, name=f"ha-{i}")
                for i in range(2)]
    for r in replicas:
        r.start(wait_ready=False)
    forwarder = ReadyForwarder(replicas)
    handle = control_plane.start_scheduler(scheduler_name="hami-ha",
                                           extender=ExtenderConfig(forwarder.url))
    try:
        wait_until(lambda: sum(r.ready() for r in replicas) == 1, timeout_s=60,
                   what="one leader")
        leader = next(r for r in replicas if r.ready())
        other = next(r for r in replicas if r is not leader)
        # the standby may still be starting its HTTP server when the leader is ready
        # (both start unwaited): wait until it serves, then it must say "not leading"
        wait_until(lambda: other.status().get("synced", False), timeout_s=30,
                   what="standby serving and synced")
        assert other.get("/readyz")[0] == 503

        def ha_pod(name: str) -> dict[str, Any]:
            return pod_in(group, name, memory_mib=2000, scheduler_name="hami-ha")

        create(kube_client, ha_pod("ha-1"))
        assert wait_bound(kube_client, "ha-1")["metadata"]["annotations"]["hami.io/vgpu-node"]
        leader.kill()
        t0 = time.monotonic()
        wait_until(other.ready, timeout_s=30, what="the standby to lead")
        takeover = time.monotonic() - t0
        create(kube_client, ha_pod("ha-2"))
        pod = wait_bound(kube_client, "ha-2")
        assert annotations(pod)["hami.io/vgpu-node"] == pod["spec"]["nodeName"]
        assert other.status()["counters"]["binds"] >= 1
        print(f"standby took over after {takeover:.1f}s")
    finally:
        handle.stop()
        forwarder.close()
        for r in replicas:
            r.stop()
