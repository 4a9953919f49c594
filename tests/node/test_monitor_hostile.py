"""The monitor against hostile containers (issue 12 §4): cache files are written by the
tenants, so a file truncated and regrown under the monitor, a symlink, a device-like
entry, or a region that claims another GPU or a higher priority must not take the
monitor down nor change what it reports or feeds back for anyone else.

The survival test runs the real monitor loop and its HTTP /metrics in its own process
(a fault there kills that process, not pytest) against an in-memory pod list."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

from hami.monitor.command import feedback_tick
from hami.monitor.lister import ContainerLister
from hami.monitor.metrics import MonitorCollector
from hami.testing.processes import free_port
from tests.node.regionfile import Proc, RegionSpec, build, read_feedback
from tests.node.test_monitor import U0, U1, pod, put, scrape

ROOT = Path(__file__).resolve().parents[2]

MONITOR = textwrap.dedent("""
    import sys, threading
    from pathlib import Path
    from hami.deviceplugin.allocate import ContainerView, PodView
    from hami.monitor.command import run_monitor
    from tests.node.fakes import FakeKube
    from tests.node.regionfile import allocated
    hook, port, gpu = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    kube = FakeKube()
    label = {"hami.io/vgpu-node": "node-a"}
    for uid in ("good", "evil"):
        kube.add_pod(PodView("ns", uid, uid, "node-a", "Running", {**label, **allocated((gpu,))},
                             (ContainerView("main"),), labels=label))
    run_monitor(node="node-a", hook_path=hook, kube=kube, stop=threading.Event(),
                bind=f"127.0.0.1:{port}", interval_s=0.01, grace_s=3600.0,
                mig_lock=hook / "no-mig.lock")
""")


def _port() -> int:
    return free_port()  # outside the ephemeral range: no client connection takes it


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return bytes(r.read()).decode()


def test_monitor_survives_a_file_truncated_and_regrown_in_a_loop(tmp_path: Path) -> None:
    """HAMi (and a mapping re-checked by size before each read) dies of SIGBUS within a
    second; here the monitor process keeps serving the other container's series."""
    hook = tmp_path / "vgpu"
    root = hook / "containers"
    put(root, "good_main", build(RegionSpec(uuids=(U0,), limits={0: 3000},
                                            procs=[Proc(pid=7, used={0: (0, 0, 77, 0, 77)})])))
    evil_data = bytes(build(RegionSpec(uuids=(U0,), limits={0: 3000}, recent_kernel=2,
                                       procs=[Proc(pid=8, used={0: (0, 0, 5, 0, 5)}) for _ in range(64)],
                                       proc_num=64)))
    evil = put(root, "evil_main", evil_data)
    port = _port()
    log = (tmp_path / "monitor.log").open("wb")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"}
    mon = subprocess.Popen([sys.executable, "-c", MONITOR, str(hook), str(port), U0], env=env,
                           stdout=log, stderr=subprocess.STDOUT)
    stop = threading.Event()

    def churn() -> None:  # the tenant: shrink and regrow its own file as fast as it can
        fd = os.open(evil, os.O_RDWR)
        try:
            while not stop.is_set():
                os.ftruncate(fd, 0)
                os.pwrite(fd, evil_data, 0)
                os.ftruncate(fd, 4096)
        finally:
            os.close(fd)

    writer = threading.Thread(target=churn, daemon=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if 'pod="good"' in _metrics(port):
                    break
            except OSError:
                pass
            assert mon.poll() is None, (tmp_path / "monitor.log").read_text()
            assert time.monotonic() < deadline, "monitor never served the good container"
            time.sleep(0.1)
        writer.start()
        # at least 4 s of churn and more than 10 scrapes, however slow a loaded machine
        # makes each scrape (the churning thread holds the GIL much of the time)
        scrapes = 0
        churn_from = time.monotonic()
        while time.monotonic() < churn_from + 4.0 or scrapes <= 10:
            assert time.monotonic() < churn_from + 120, f"only {scrapes} scrapes in 120 s"
            try:
                body = _metrics(port)
            except OSError as exc:
                rc = mon.wait(timeout=5)
                raise AssertionError(f"monitor died (rc {rc}) after {scrapes} scrapes: {exc}") from None
            good = [ln for ln in body.splitlines()
                    if ln.startswith("hami_vgpu_memory_used_bytes{") and 'pod="good"' in ln]
            assert len(good) == 1 and good[0].endswith(" 77.0"), body
            scrapes += 1
        assert mon.poll() is None, f"monitor died (rc {mon.returncode})"
        assert scrapes > 10
    finally:
        stop.set()
        if writer.is_alive():
            writer.join(timeout=5)
        mon.kill()
        mon.wait()
        log.close()


def test_region_claiming_a_foreign_gpu_and_priority_0_changes_nothing(tmp_path: Path) -> None:
    """The attacker's pod was granted U1 at priority 1; its region claims U0 at priority 0
    and a recent launch. The victim (U0, priority 1, launching) is neither blocked nor
    throttled, and no series of the attacker names U0."""
    root = tmp_path / "c"
    victim = put(root, "v_main", build(RegionSpec(uuids=(U0,), priority=1, recent_kernel=2,
                                                  procs=[Proc(used={0: (0, 0, 9, 0, 9)})])))
    put(root, "a_main", build(RegionSpec(uuids=(U0,), priority=0, recent_kernel=2,
                                         procs=[Proc(used={0: (0, 0, 5, 0, 5)})])))
    pods = [pod("v", "victim", ("main",), gpus=(U0,), priority=1),
            pod("a", "attacker", ("main",), gpus=(U1,), priority=1)]
    lister = ContainerLister(root)
    lister.update({"v", "a"})
    out = {c.key: (c.recent_kernel, c.utilization_switch) for c in feedback_tick(lister, pods)}
    assert out["v_main"] == (1, 0)                      # alone on U0: runs, unthrottled
    assert read_feedback(victim.read_bytes()) == (0, 1)
    m = scrape(MonitorCollector("n", lister, lambda: pods))
    assert [(lbl["pod"], lbl["device_uuid"]) for lbl, _ in m["hami_vgpu_memory_used_bytes"]] == [
        ("victim", U0)]
    lister.close()


def test_region_priority_is_not_the_pods(tmp_path: Path) -> None:
    """Both pods share U0 at priority 1 (their specs); one region claims priority 0:
    contention throttles both, neither is blocked."""
    root = tmp_path / "c"
    victim = put(root, "v_main", build(RegionSpec(uuids=(U0,), priority=1, recent_kernel=2)))
    liar = put(root, "l_main", build(RegionSpec(uuids=(U0,), priority=0, recent_kernel=2)))
    pods = [pod("v", "victim", ("main",), gpus=(U0,), priority=1),
            pod("l", "liar", ("main",), gpus=(U0,), priority=1)]
    lister = ContainerLister(root)
    lister.update({"v", "l"})
    feedback_tick(lister, pods)
    assert read_feedback(victim.read_bytes()) == (1, 1)  # throttled, not blocked (-1)
    assert read_feedback(liar.read_bytes()) == (1, 1)
    # the pod spec's priority 0 is honoured: it is the tenant's declared request
    pods[1] = pod("l", "liar", ("main",), gpus=(U0,), priority=0)
    for f in (victim, liar):
        with open(f, "r+b") as fh:
            fh.seek(2_008_904)
            fh.write((2).to_bytes(4, "little"))
    feedback_tick(lister, pods)
    assert read_feedback(victim.read_bytes()) == (1, -1)
    lister.close()


def test_symlinked_cache_file_is_never_followed(tmp_path: Path) -> None:
    """A container may put a symlink where its cache file should be; the monitor resolves
    it on the host, so it would read and write the host file it names. It is skipped and
    the host file untouched (device nodes and FIFOs are refused the same way: only a
    regular file is ever opened)."""
    root = tmp_path / "c"
    put(root, "good_main", build(RegionSpec(uuids=(U0,), procs=[Proc(used={0: (0, 0, 3, 0, 3)})])))
    d = root / "evil_main"
    d.mkdir(parents=True)
    target = tmp_path / "host-file"
    target.write_bytes(bytes(build(RegionSpec(uuids=(U0,), recent_kernel=2))))
    before = target.read_bytes()
    (d / "x.cache").symlink_to(target)
    pods = [pod("good", "good", ("main",)), pod("evil", "evil", ("main",))]
    lister = ContainerLister(root)
    t = threading.Thread(target=lister.update, args=({"good", "evil"},), daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "the monitor blocked opening the entry"
    assert set(lister.containers) == {"good_main"} and "evil_main" in lister.errors
    feedback_tick(lister, pods)
    assert target.read_bytes() == before
    m = scrape(MonitorCollector("n", lister, lambda: pods))
    assert [lbl["pod"] for lbl, _ in m["hami_vgpu_memory_used_bytes"]] == ["good"]
    lister.close()
