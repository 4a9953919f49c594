"""Many processes starting libvgpu at once on one node (issue 26 item 4), on the stub driver.

Speed figures are in bench/bench_startup.py; these tests check what must hold
whatever the speed: every process of a busy node gets its slot and is refused
only for its limit, and no process of a container, crashed or stopped in the
middle of its start, holds up the host-PID detection of the others."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

import pytest
from libvgpu_harness import Env, lines

from hami.monitor import region as reg

pytestmark = pytest.mark.native

MiB = 1 << 20
OFFSET = 100000  # the stub reports pid + OFFSET to NVML, as a PID namespace does


def _wait_up(p: subprocess.Popen[str], hang_guard_s: float = 120) -> None:
    """Read ``p``'s stdout until it prints "up"; a process that exits first, or hangs
    for ``hang_guard_s``, fails the test."""
    assert p.stdout is not None
    deadline = time.monotonic() + hang_guard_s
    buf = b""
    fd = p.stdout.fileno()
    while b"up\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"{p.args} did not start in {hang_guard_s} s (hung); output {buf!r}")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise AssertionError(f"{p.args} exited with {p.wait()} before it started; output {buf!r}")
        buf += chunk


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()
        for f in (p.stdout, p.stderr):
            if f:
                f.close()


def test_forty_processes_in_two_containers_start_at_once_and_hold_their_memory(env: Env) -> None:
    """More processes than the stub node once held records for (32) run at once on one
    node: each registers its own slot in its container's region and holds its
    allocation; a process of the full container asking for more is refused, the
    others are not."""
    per = 20
    regions = [env.tmp / "c0.cache", env.tmp / "c1.cache"]
    procs = [env.popen("init", "alloc", "mem", str(2 * MiB), "0", "echo", "up", "hold",
                       CUDA_DEVICE_MEMORY_SHARED_CACHE=str(regions[i % 2]), CUDA_DEVICE_MEMORY_LIMIT="40m")
             for i in range(2 * per)]
    try:
        for p in procs:
            _wait_up(p)
        for c, path in enumerate(regions):
            r = reg.parse_region(path.read_bytes())
            mine = sorted(p.pid for p in procs[c::2])
            assert sorted(s.pid for s in r.active_procs()) == mine
            assert r.used_memory_bytes(0) == per * 2 * MiB
        # container 0 is full (40 MiB in use): one byte more is refused, a free is not needed elsewhere
        over = env.run("init", "alloc", "mem", "1", "2", "info",
                       CUDA_DEVICE_MEMORY_SHARED_CACHE=str(regions[0]), CUDA_DEVICE_MEMORY_LIMIT="40m")
        assert lines(over.stdout, "info")[0][:2] == [0, 40 * MiB]
    finally:
        _stop(procs)


def _nvml_pids(env: Env) -> set[int]:
    """Host PIDs the stub's NVML lists on device 0 (no preload: the node's view)."""
    out = env.run("procs", "0", preload=False).stdout
    return {row[0] for row in lines(out, "proc")}


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_process_dying_or_stopped_during_its_start_does_not_hold_up_the_others(env: Env, how: str) -> None:
    """Process A of a container is stopped or killed while it creates its first context
    (the moment host-PID detection observes). HAMi serialised detection per container
    with the region's sem_postinit: a dead holder left it taken, so process B waited
    5 minutes and then ran without SM limiting; B must find its host PID."""
    common = {"CUDA_DEVICE_SM_LIMIT": "30", "VGPU_STUB_PID_OFFSET": str(OFFSET)}
    a = env.popen("init", "echo", "up", "hold", VGPU_STUB_RETAIN_DELAY_MS="600000", **common)
    b = None
    try:
        deadline = time.monotonic() + 60
        while a.pid + OFFSET not in _nvml_pids(env):  # A is inside its context creation
            assert a.poll() is None and time.monotonic() < deadline, "A never created its context"
            time.sleep(0.05)
        a.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        if how == "killed":
            a.wait()
        b = env.popen("init", "echo", "up", "hold", LIBCUDA_LOG_LEVEL="2", **common)
        _wait_up(b)
        (slot,) = [s for s in reg.parse_region(env.region_path.read_bytes()).active_procs() if s.pid == b.pid]
        assert slot.host_pid == b.pid + OFFSET
    finally:
        if how == "stopped" and a.poll() is None:
            a.send_signal(signal.SIGCONT)
        _stop([a] + ([b] if b else []))


def test_processes_of_two_containers_detecting_at_once_each_find_their_own_host_pid(env: Env) -> None:
    """Sixteen processes in two containers create their contexts at the same time (each
    creation slow, so their detection rounds overlap); NVML lists the newest first.
    Every slot records its own process's host PID, none another's."""
    common = {"CUDA_DEVICE_SM_LIMIT": "30", "VGPU_STUB_PID_OFFSET": str(OFFSET), "VGPU_STUB_NVML_REVERSE": "1",
              "VGPU_STUB_RETAIN_DELAY_MS": "200"}
    regions = [env.tmp / "c0.cache", env.tmp / "c1.cache"]
    procs = [env.popen("init", "echo", "up", "hold", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(regions[i % 2]), **common)
             for i in range(16)]
    try:
        for p in procs:
            _wait_up(p)
        for c, path in enumerate(regions):
            slots = {s.pid: s.host_pid for s in reg.parse_region(path.read_bytes()).active_procs()}
            assert slots == {p.pid: p.pid + OFFSET for p in procs[c::2]}
    finally:
        _stop(procs)
