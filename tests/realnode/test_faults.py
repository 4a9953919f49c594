"""Faults on the real node: the device plugin, the kubelet, the Node object and the hami
scheduler fail while GPU pods come and go (issue 13 §2).

Every GPU pod here checks inside its container that the limit it runs under is its own:
``CUDA_DEVICE_MEMORY_LIMIT_0`` equals its ``nvidia.com/gpumem`` and ``cuMemGetInfo``
(libvgpu on the stub driver) reports exactly that total; the pods of one test ask for
distinct sizes, so a limit handed to the wrong pod, or none at all, fails the pod (exit 3
or 4) instead of passing unnoticed.

Outcomes decided here (what is right, and why):

* Device plugin killed while pods are being created: a pod the kubelet admits while no
  plugin serves ``nvidia.com/gpu`` (killed, or not yet registered again) is refused by the
  kubelet itself: phase ``Failed``, reason ``UnexpectedAdmissionError``, no container ever
  started. That is the kubelet's rule for any device plugin (HAMi's and NVIDIA's alike);
  the plugin cannot hold the pod. A controller (Job, Deployment) makes a new pod. What
  hami must guarantee: no such pod runs (so never without its limit), its node lock does
  not block the node (the scheduler takes over a lock whose owner failed), and every pod
  created once the plugin is back runs with its own limit.
* Kubelet restarted: the kubelet empties ``device-plugins/`` and opens a new
  ``kubelet.sock``; the plugin notices (its socket gone, the kubelet socket's inode
  changed), serves again and registers; a GPU pod runs with its limit; a GPU pod running
  across the restart keeps running (the kubelet re-admits it from its checkpoint).
* Node object deleted: the kubelet does not create it again by itself (it registers once
  per start; verified below: the Node stays absent), so the Node comes back when the
  kubelet restarts, as on a reboot or a kubelet upgrade; the device plugin, which kept
  running, must write ``hami.io/node-nvidia-register`` on the new object, and a GPU pod is
  placed there again.
* hami scheduler SIGKILLed during a burst: pods whose filter or bind failed while it was
  down are retried by kube-scheduler; the restarted scheduler rebuilds each card's usage
  from the pods' annotations, so no card is promised twice (ten pods whose slices fit
  only five per card all run at once) and every pod ends ``Succeeded``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from lightkube import ApiError, codecs
from lightkube.resources.core_v1 import Node, Pod

from hami.core.codec import decode_pod_devices
from hami.testing.controlplane import wait_until
from hami.testing.gpubed import GpuBed, kill
from hami.testing.gpupods import STUB_DIR, gpu_test_pod, wait_pod_done

MiB = 1 << 20
CARD_MIB = 16384  # default_inventory's cards
REGISTER = "hami.io/node-nvidia-register"
ALLOCATED = "hami.io/vgpu-devices-allocated"
REGISTERED_LINE = "registered nvidia.com/gpu with kubelet"


def checked(memory_mib: int, barrier: str | None = None) -> str:
    """Shell: exit 3 unless ``CUDA_DEVICE_MEMORY_LIMIT_0`` is this pod's ``<n>m``, 4 unless
    cuMemGetInfo's total is exactly ``memory_mib`` MiB; then, with ``barrier``, wait for
    that file in the node's stub directory (a hostPath) before exiting 0."""
    want = memory_mib * MiB
    cmd = (f'echo "limit=$CUDA_DEVICE_MEMORY_LIMIT_0"; '
           f'[ "$CUDA_DEVICE_MEMORY_LIMIT_0" = "{memory_mib}m" ] || exit 3; '
           f'out=$(vgtest init info); echo "$out"; '
           f'case "$out" in "info "*" {want} 0") ;; *) exit 4;; esac')
    if barrier:
        cmd += f"; echo waiting; while [ ! -e {STUB_DIR}/{barrier} ]; do sleep 0.2; done"
    return cmd


def create(client: Any, name: str, memory_mib: int, barrier: str | None = None) -> float:
    """Create a checked GPU pod; return its creation time (monotonic)."""
    client.create(codecs.from_dict(gpu_test_pod(name, checked(memory_mib, barrier),
                                                memory_mib=memory_mib)))
    return time.monotonic()


def release(bed: GpuBed, barrier: str) -> None:
    assert bed.node is not None
    path = bed.node.host_path(STUB_DIR) / barrier
    path.write_text("go\n")


def registrations(bed: GpuBed) -> int:
    """How often the device plugin registered with a kubelet (its log, all runs)."""
    assert bed.plugin is not None
    return bed.plugin.log_path.read_text(errors="replace").count(REGISTERED_LINE)


def wait_registered(bed: GpuBed, before: int, timeout_s: float = 60.0) -> float:
    return wait_until(lambda: registrations(bed) > before, timeout_s=timeout_s,
                      what="device plugin registered with the kubelet again",
                      alive=bed.check_alive)


def gpu_allocatable(client: Any, node: str) -> int:
    n = client.get(Node, node)
    return int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) if n.status else 0


def started(client: Any, name: str) -> bool:
    """The pod's container has run (Running or terminated)."""
    pod = client.get(Pod, name)
    return bool(pod.status and pod.status.phase in ("Running", "Succeeded", "Failed")
                and any(cs.state and (cs.state.running or cs.state.terminated)
                        for cs in pod.status.containerStatuses or []))


def log_of(bed: GpuBed, name: str) -> str:
    assert bed.node is not None
    return bed.node.container_log("default", name, "c")


def wait_done(client: Any, names: Iterable[str], timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    return {n: wait_pod_done(client, n, timeout_s=max(1.0, deadline - time.monotonic()))
            for n in names}


def assert_own_limit(bed: GpuBed, name: str, memory_mib: int, pod: Any) -> None:
    log = log_of(bed, name)
    assert pod.status.phase == "Succeeded", f"{name}: {pod.status.phase} {pod.status.reason} {log}"
    assert f"limit={memory_mib}m" in log and f" {memory_mib * MiB} 0" in log, log


def report(test: str, note: str = "", **seconds: float) -> None:
    """Print the test's figures (seen with ``pytest -s``)."""
    print(f"\n[{test}] " + ", ".join(f"{k}={v:.1f}s" for k, v in seconds.items()) + note)


# -- 1. device plugin killed while pods are being created ----------------------------------


def test_plugin_killed_while_pods_are_created(bed: GpuBed, client: Any) -> None:
    sizes = {f"dp-{i}": 1101 + 101 * i for i in range(8)}  # distinct slices, all fit
    names = list(sizes)
    created: dict[str, float] = {}
    for n in names[:3]:
        created[n] = create(client, n, sizes[n])
    # Kill once the first pod is bound: it is then being admitted or allocated, the next
    # two wait for the node lock.
    wait_until(lambda: bool(client.get(Pod, names[0]).spec.nodeName), timeout_s=60,
               what=f"{names[0]} bound")
    before = registrations(bed)
    assert bed.plugin is not None
    t_kill = time.monotonic()
    kill(bed.plugin)
    for n in names[3:5]:  # created while no plugin runs
        created[n] = create(client, n, sizes[n])
    bed.start_plugin()
    registered_s = wait_registered(bed, before)
    down_s = time.monotonic() - t_kill
    for n in names[5:]:  # created once the plugin is back
        created[n] = create(client, n, sizes[n])
    pods = wait_done(client, names, timeout_s=150)

    outcomes = {n: (p.status.phase, p.status.reason or "") for n, p in pods.items()}
    print("\noutcomes:", outcomes)
    for n, pod in pods.items():
        if pod.status.phase == "Succeeded":
            assert_own_limit(bed, n, sizes[n], pod)
        else:  # refused by the kubelet: never started, so never ran without its limit
            assert pod.status.reason == "UnexpectedAdmissionError", (n, pod.status, log_of(bed, n))
            assert log_of(bed, n) == "", n
            assert not any(cs.state and (cs.state.running or cs.state.terminated)
                           for cs in pod.status.containerStatuses or []), pod.status
    for n in names[5:]:
        assert outcomes[n] == ("Succeeded", ""), outcomes
    failed = sum(1 for p, _ in outcomes.values() if p == "Failed")
    report("plugin-restart", note=f" ({failed} of {len(names)} refused by the kubelet)",
           plugin_down=down_s, reregistered_after_start=registered_s,
           last_pod_create_to_done=time.monotonic() - created[names[-1]])


# -- 2. kubelet restarted -------------------------------------------------------------------


def test_kubelet_restart_plugin_registers_again(bed: GpuBed, client: Any) -> None:
    assert bed.node is not None
    create(client, "kr-survivor", 2222, barrier="go-kr-survivor")
    wait_until(lambda: started(client, "kr-survivor") and "waiting" in log_of(bed, "kr-survivor"),
               timeout_s=60, what="kr-survivor running")
    before, watches = registrations(bed), bed.kubelet_watches()
    t0 = time.monotonic()
    bed.node.stop_kubelet()
    bed.node.start_kubelet()
    ready_s = time.monotonic() - t0
    wait_registered(bed, before, timeout_s=30)
    registered_s = time.monotonic() - t0
    # the new kubelet watches the plugin (the Node's allocatable may still be the old
    # kubelet's: it alone does not say the new one admits GPU pods)
    wait_until(lambda: bed.kubelet_watches() > watches
               and gpu_allocatable(client, bed.node_name) > 0, timeout_s=30,
               what="the new kubelet watching the plugin, nvidia.com/gpu allocatable again")
    allocatable_s = time.monotonic() - t0

    t1 = create(client, "kr-after", 777)
    pod = wait_pod_done(client, "kr-after", timeout_s=90)
    assert_own_limit(bed, "kr-after", 777, pod)
    after_s = time.monotonic() - t1

    survivor = client.get(Pod, "kr-survivor")
    assert survivor.status.phase == "Running", survivor.status  # not re-admitted away
    release(bed, "go-kr-survivor")
    assert_own_limit(bed, "kr-survivor", 2222, wait_pod_done(client, "kr-survivor", timeout_s=60))
    report("kubelet-restart", node_ready=ready_s, plugin_registered=registered_s,
           allocatable=allocatable_s, pod_create_to_done=after_s)


# -- 3. Node object deleted and re-created --------------------------------------------------


def test_node_recreated_gets_register_annotation_and_runs_pods(bed: GpuBed, client: Any) -> None:
    assert bed.node is not None
    old = client.get(Node, bed.node_name)
    assert REGISTER in (old.metadata.annotations or {})
    client.delete(Node, bed.node_name)

    def gone() -> bool:
        try:
            client.get(Node, bed.node_name)
        except ApiError as err:
            return err.status.code == 404
        return False

    wait_until(gone, timeout_s=30, what="Node deleted")
    time.sleep(3.0)  # > the plugin's register interval (1 s) and the kubelet's status period
    assert gone(), "the kubelet re-created its Node by itself: update this test's docstring"

    t0 = time.monotonic()
    watches = bed.kubelet_watches()
    bed.node.stop_kubelet()
    bed.node.start_kubelet()  # registers the Node again; waits until it is Ready
    node_s = time.monotonic() - t0
    new: list[Any] = [None]

    def registered() -> bool:  # and the new kubelet watches the plugin (admits GPU pods)
        new[0] = client.get(Node, bed.node_name)
        return REGISTER in (new[0].metadata.annotations or {}) and bed.kubelet_watches() > watches

    wait_until(registered, timeout_s=30, what=f"{REGISTER} on the re-created Node",
               alive=bed.check_alive)
    annotated_s = time.monotonic() - t0
    assert new[0].metadata.uid != old.metadata.uid
    assert new[0].metadata.annotations[REGISTER] == old.metadata.annotations[REGISTER]

    t1 = create(client, "nr-after", 888)
    assert_own_limit(bed, "nr-after", 888, wait_pod_done(client, "nr-after", timeout_s=90))
    report("node-recreated", node_back=node_s, annotation_back=annotated_s,
           pod_create_to_done=time.monotonic() - t1)


# -- 4. hami scheduler killed during a burst ------------------------------------------------


def test_scheduler_killed_during_burst_promises_no_card_twice(bed: GpuBed, client: Any) -> None:
    # Ten slices of which exactly five fit on one 16 GiB card (5 x ~3 GiB < 16 GiB <
    # 6 x 3 GiB): all ten run at once only when no card is promised twice.
    sizes = {f"sb-{i}": 3000 + 10 * i for i in range(10)}
    assert sum(sorted(sizes.values())[-5:]) <= CARD_MIB < sum(sorted(sizes.values())[:6])
    created = {n: create(client, n, m, barrier="go-sb") for n, m in sizes.items()}

    def bound() -> int:
        return sum(1 for n in sizes if client.get(Pod, n).spec.nodeName)

    wait_until(lambda: bound() >= 2, timeout_s=60, what="two burst pods bound")
    t_kill = time.monotonic()
    bound_at_kill = bound()
    bed.restart_scheduler()
    restart_s = time.monotonic() - t_kill

    running: dict[str, float] = {}

    def all_running() -> bool:
        for n in sizes:
            if n not in running and started(client, n) and "waiting" in log_of(bed, n):
                running[n] = time.monotonic()
        for n in sizes:  # a pod that exited already failed its check: stop waiting
            pod = client.get(Pod, n)
            assert pod.status.phase != "Failed" and pod.status.phase != "Succeeded", (
                n, pod.status, log_of(bed, n))
        return len(running) == len(sizes)

    wait_until(all_running, timeout_s=150, what="all ten burst pods running",
               alive=bed.check_alive)
    per_card: dict[str, int] = defaultdict(int)
    for n in sizes:
        ann = client.get(Pod, n).metadata.annotations or {}
        ((dev,),) = decode_pod_devices(ann[ALLOCATED])
        assert dev.used_memory_mib == sizes[n], (n, ann[ALLOCATED])
        per_card[dev.uuid] += dev.used_memory_mib
    print("\nper card MiB:", dict(per_card))
    assert all(v <= CARD_MIB for v in per_card.values()), per_card
    release(bed, "go-sb")
    for n, pod in wait_done(client, sizes, timeout_s=90).items():
        assert_own_limit(bed, n, sizes[n], pod)
    to_running = sorted(running[n] - created[n] for n in sizes)
    report("scheduler-restart", scheduler_restart=restart_s,
           first_create_to_running=to_running[0], median_create_to_running=to_running[4],
           last_create_to_running=to_running[-1], note=f" ({bound_at_kill} of 10 bound at the kill)")
