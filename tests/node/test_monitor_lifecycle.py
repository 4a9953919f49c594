"""The monitor and the pod lifecycle: per-container series only for running containers,
finished pods' files neither reported nor fed back, their directories kept until the pod
is deleted. Cache files are written byte for byte at the documented offsets; the loop runs
with its real HTTP /metrics endpoint against an in-memory pod list."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from lightkube.models.core_v1 import (
    Container,
    ContainerState,
    ContainerStateRunning,
    ContainerStateTerminated,
    ContainerStateWaiting,
    ContainerStatus,
    PodSpec,
    PodStatus,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from hami.deviceplugin.allocate import ContainerView, PodView
from hami.deviceplugin.kube import pod_view
from hami.monitor.command import feedback_tick, run_monitor
from hami.monitor.lister import ContainerLister
from hami.monitor.metrics import MonitorCollector
from hami.testing.processes import free_port
from tests.node.fakes import FakeKube
from tests.node.regionfile import Proc, RegionSpec, allocated, build, read_feedback
from tests.node.test_monitor import U0, U1, put, scrape

VGPU_NODE = {"hami.io/vgpu-node": "node-a"}


def _port() -> int:
    return free_port()  # outside the ephemeral range: no client connection takes it


def _until(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _body(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return bytes(r.read()).decode()


def test_finished_pod_not_reported_nor_fed_back_dir_kept_until_deleted(tmp_path: Path) -> None:
    """A Succeeded pod (its killed process left a used slot and a high-priority "recent
    launch" in the region) next to a Running one on the same GPU, through the real loop."""
    hook = tmp_path / "vgpu"
    root = hook / "containers"
    done = put(root, "done_main", build(RegionSpec(
        uuids=(U0,), limits={0: 3000}, priority=0, recent_kernel=1000,
        procs=[Proc(pid=7, used={0: (0, 0, 5, 0, 5)}, sm_util={0: 40})])))
    run = put(root, "run_main", build(RegionSpec(
        uuids=(U0,), limits={0: 3000}, priority=1, recent_kernel=2,
        procs=[Proc(pid=8, used={0: (0, 0, 7, 0, 7)}, sm_util={0: 10})])))
    kube = FakeKube()
    kube.add_pod(PodView("ns", "finished", "done", "node-a", "Succeeded",
                         {**VGPU_NODE, **allocated((U0,))},
                         (ContainerView("main", {"CUDA_TASK_PRIORITY": "0"}),), labels=VGPU_NODE))
    kube.add_pod(PodView("ns", "busy", "run", "node-a", "Running", {**VGPU_NODE, **allocated((U0,))},
                         (ContainerView("main", {"CUDA_TASK_PRIORITY": "1"}),), labels=VGPU_NODE))
    port, stop = _port(), threading.Event()
    t = threading.Thread(target=run_monitor, kwargs=dict(
        node="node-a", hook_path=hook, kube=kube, stop=stop, bind=f"127.0.0.1:{port}",
        interval_s=0.05, grace_s=0.0, mig_lock=tmp_path / "none.lock"), daemon=True)
    t.start()
    try:
        _until(lambda: kube.calls.count("list_pods") >= 5, "five monitor ticks")
        body = _body(port)
        assert (f'hami_vgpu_memory_used_bytes{{container="main",device_uuid="{U0}",'
                f'namespace="ns",pod="busy",vdevice_index="0",zone="vGPU"}} 7.0') in body
        assert 'pod="finished"' not in body          # no per-container family at all
        assert done.exists()                         # the directory stays while the pod does
        # the feedback loop neither counted the finished pod as active nor wrote to it
        assert read_feedback(done.read_bytes()) == (1, 1000)
        assert read_feedback(run.read_bytes()) == (0, 0)
        kube.delete_pod("ns", "finished")
        _until(lambda: not done.parent.exists(), "the deleted pod's directory to go")
        assert run.exists() and 'pod="busy"' in _body(port)
    finally:
        stop.set()
        t.join(timeout=10)


def test_pod_finishing_unmaps_its_file_and_keeps_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "c"
    path = put(root, "u_c", build(RegionSpec(uuids=(U0,), procs=[Proc(used={0: (0, 0, 3, 0, 3)})])))
    lister = ContainerLister(root)
    pods = [PodView("ns", "p", "u", "node-a", "Running", allocated((U0,)), (ContainerView("c"),))]
    col = MonitorCollector("node-a", lister, lambda: pods)
    lister.update({"u"}, set())
    assert scrape(col)["hami_vgpu_memory_used_bytes"][0][1] == 3.0
    cf = lister.containers["u_c"]
    lister.update({"u"}, {"u"})                      # the pod is Succeeded or Failed now
    assert cf.closed and lister.containers == {}
    assert path.exists()
    pods[0] = replace(pods[0], phase="Failed")
    assert "hami_vgpu_memory_used_bytes" not in scrape(col)
    lister.update({"u"}, {"u"})                      # not reloaded on later ticks
    assert lister.containers == {} and path.exists()


def test_finished_pod_no_series_even_with_its_file_still_mapped(tmp_path: Path) -> None:
    """The scrape may see a pod list newer than the lister's last scan."""
    root = tmp_path / "c"
    put(root, "u_c", build(RegionSpec(uuids=(U0,), procs=[Proc(used={0: (0, 0, 3, 0, 3)})])))
    lister = ContainerLister(root)
    lister.update({"u"})
    migs = ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-m","profile":"1g.10gb",'
            '"migUUID":"MIG-x","gpuInstanceID":3,"computeInstanceID":0}]')
    for phase in ("Succeeded", "Failed"):
        p = PodView("ns", "p", "u", "node-a", phase, {"hami.io/vgpu-mig-allocations": migs},
                    (ContainerView("c"),))
        m = scrape(MonitorCollector("node-a", lister, lambda p=p: [p], legacy=True))
        assert not [k for k, rows in m.items() for lbl, _ in rows
                    if lbl.get("pod") == "p" or lbl.get("podname") == "p"], phase


def test_series_only_for_running_containers(tmp_path: Path) -> None:
    """One pod, Running: a running container, a finished sidecar, one in restart back-off,
    one the kubelet has not reported yet, and a finished init container."""
    root = tmp_path / "c"
    names = ("init", "main", "side", "crash", "new")
    for i, name in enumerate(names):
        put(root, f"u_{name}", build(RegionSpec(
            uuids=(U0, U1), limits={0: 100, 1: 100}, last_kernel_time=5,
            procs=[Proc(pid=10 + i, used={0: (1, 0, 2, 0, 3), 1: (1, 0, 1, 0, 2)},
                        sm_util={0: 9})])))
    lister = ContainerLister(root)
    lister.update({"u"})
    migs = ('[{"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-m","profile":"1g.10gb",'
            '"migUUID":"MIG-main","gpuInstanceID":3,"computeInstanceID":0},'
            '{"containerIndex":2,"deviceIndex":0,"gpuUUID":"GPU-m","profile":"1g.10gb",'
            '"migUUID":"MIG-side","gpuInstanceID":4,"computeInstanceID":0}]')
    p = PodView("ns", "p", "u", "node-a", "Running",
                {"hami.io/vgpu-mig-allocations": migs, **allocated(*((U0, U1) for _ in names))},
                tuple(ContainerView(n) for n in names), n_init=1,
                container_states={"init": "terminated", "main": "running",
                                  "side": "terminated", "crash": "waiting"})
    m = scrape(MonitorCollector("node-a", lister, lambda: [p], legacy=True, clock=lambda: 9.0))
    per_container = [k for k, rows in m.items() if rows and ("container" in rows[0][0]
                                                            or "ctrname" in rows[0][0])]
    assert len(per_container) == 15                  # every family, legacy ones included
    for family in per_container:
        shown = {lbl.get("container", lbl.get("ctrname")) for lbl, _ in m[family]}
        expected = {"main"} if "mig" in family.lower() else {"main", "new"}
        assert shown == expected, family
    assert [lbl["mig_uuid"] for lbl, _ in m["hami_mig_device_info"]] == ["MIG-main"]
    # the feedback loop still acts on a live pod's stopped containers (they may restart)
    assert {c.key for c in feedback_tick(lister, [p])} == {f"u_{n}" for n in names}


def test_pod_view_reads_container_states() -> None:
    def status(name: str, state: ContainerState | None) -> ContainerStatus:
        return ContainerStatus(image="x", imageID="", name=name, ready=False, restartCount=0,
                               state=state)

    pod = Pod(metadata=ObjectMeta(name="p", namespace="ns", uid="u"),
              spec=PodSpec(nodeName="node-a", initContainers=[Container(name="init")],
                           containers=[Container(name=n) for n in ("main", "side", "crash", "new")]),
              status=PodStatus(
                  phase="Running",
                  initContainerStatuses=[status("init", ContainerState(
                      terminated=ContainerStateTerminated(exitCode=0)))],
                  containerStatuses=[
                      status("main", ContainerState(running=ContainerStateRunning())),
                      status("side", ContainerState(terminated=ContainerStateTerminated(exitCode=1))),
                      status("crash", ContainerState(waiting=ContainerStateWaiting(
                          reason="CrashLoopBackOff"))),
                      status("new", None)]))
    view = pod_view(pod)
    assert dict(view.container_states) == {"init": "terminated", "main": "running",
                                           "side": "terminated", "crash": "waiting"}
    assert pod_view(Pod(metadata=ObjectMeta(name="q", namespace="ns", uid="v"),
                        spec=PodSpec(containers=[Container(name="c")]))).container_states == {}


def test_pod_view_names_the_sidecars() -> None:
    """Only an init container with ``restartPolicy: Always`` is a sidecar (issue 25)."""
    pod = Pod(metadata=ObjectMeta(name="p", namespace="ns", uid="u"),
              spec=PodSpec(initContainers=[Container(name="warm"),
                                           Container(name="side", restartPolicy="Always")],
                           containers=[Container(name="main")]))
    view = pod_view(pod)
    assert view.sidecars == frozenset({"side"})
    assert [c.name for c in view.long_running()] == ["side", "main"]
