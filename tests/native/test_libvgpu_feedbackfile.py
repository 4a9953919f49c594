"""The monitor's feedback reaches libvgpu through a file no container can write.

A "container" here is a directory holding a copy of libvgpu.so, ``limits.env`` and,
as the device plugin mounts it read-only next to the library, ``feedback``
(:mod:`hami.deviceplugin.feedbackfile`). The region is the container's own file: its
processes can write ``utilization_switch`` and ``recent_kernel`` there. With the
feedback file present, neither write changes what the library does; without it (HAMi's
device plugin, pods started before the file existed) the region's fields apply as in
HAMi-core.

The block tests wait a fixed second only in the direction that cannot flake: a blocked
launch never finishes by itself, however slow the machine. The rate tests read the
simulated GPU's busy percent the process held (libvgpu_harness.steady_busy_percent), with
a wide margin (10 % share: under 50 %; free: over 60 %).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from libvgpu_harness import FREE, STEADY, Env, steady_busy_percent
from test_libvgpu_compute import BUSY, _set

from hami.deviceplugin import feedbackfile
from hami.monitor import region as reg

pytestmark = pytest.mark.native


def container(env: Env, feedback: bytes | None, sm: int = 10) -> Path:
    """The container's ``<H>/vgpu``: the library, limits.env (SM share ``sm`` percent, the
    test's region) and, unless None, the feedback file's bytes."""
    d = env.tmp / "vgpu"
    d.mkdir(exist_ok=True)
    shutil.copy(env.build / "libvgpu.so", d / "libvgpu.so")
    (d / "limits.env").write_text(f"CUDA_DEVICE_SM_LIMIT={sm}\n"
                                  f"CUDA_DEVICE_MEMORY_SHARED_CACHE={env.region_path}\n")
    if feedback is not None:
        (d / feedbackfile.FEEDBACK_FILE).write_bytes(feedback)
    return d


def preload(d: Path) -> dict[str, str]:
    return {"LD_PRELOAD": str(d / "libvgpu.so")}


def _stays_blocked(env: Env, d: Path, release: object = None, **kv: str) -> None:
    """A launch of the container stays blocked for a second while the region says
    ``recent_kernel = 2`` (written by the container before and during the wait); then
    ``release()`` unblocks it and the launches complete."""
    p = env.popen("init", "echo", "ready", "launch", "3", "1", "echo", "done", **preload(d), **kv)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        for _ in range(10):
            _set(env, "recent_kernel", 2)  # the container's own write over the block
            time.sleep(0.1)
        assert p.poll() is None, p.communicate()  # still blocked in the first launch
        assert callable(release)
        release()
        out, _ = p.communicate(timeout=30)
        assert "launched 3" in out and "done" in out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_process_that_clears_the_switch_in_its_region_is_still_throttled(env: Env) -> None:
    d = container(env, feedbackfile.encode(1, False))  # the monitor: contended
    env.run("init", **preload(d), **BUSY)  # creates the region and busy stub state
    _set(env, "utilization_switch", 0)  # the tenant: "uncontended"
    p = env.run("init", *STEADY, **preload(d), **BUSY)
    assert steady_busy_percent(p.stdout) < 50, p.stdout
    assert reg.parse_region(env.region_path.read_bytes()).utilization_switch == 0


def test_the_monitors_uncontended_holds_whatever_the_region_says(env: Env) -> None:
    """Honest path: the file says uncontended, the region (left at libvgpu's initial 1)
    is ignored: launches run free."""
    d = container(env, feedbackfile.encode(0, False))
    env.run("init", **preload(d), **BUSY)  # creates the stub state with busy launches
    _set(env, "utilization_switch", 1)
    p = env.run("init", *FREE, **preload(d), **BUSY)
    assert steady_busy_percent(p.stdout) > 60, p.stdout


def test_a_blocked_process_that_writes_recent_kernel_2_stays_blocked(env: Env) -> None:
    d = container(env, feedbackfile.encode(1, True), sm=50)  # the monitor: blocked
    env.run("init", **preload(d), **BUSY)  # creates the stub state with busy launches
    fb = str(d / feedbackfile.FEEDBACK_FILE)
    _stays_blocked(env, d, lambda: feedbackfile.write(fb, 1, False))
    # the launches still mark the region: the monitor's activity signal
    assert reg.parse_region(env.region_path.read_bytes()).recent_kernel == 2


ENV_TRIES = {
    "VGPU_FEEDBACK_FILE": "{other}/feedback", "HAMI_FEEDBACK_FILE": "{other}/feedback",
    "VGPU_FEEDBACK": "{other}/feedback", "CUDA_DEVICE_MEMORY_SHARED_CACHE": "{other}/x.cache",
    "LD_LIBRARY_PATH": "{other}", "GPU_CORE_UTILIZATION_POLICY": "default",
}


def test_no_environment_variable_moves_the_feedback_file(env: Env) -> None:
    """The tenant's own feedback file (unblocked, uncontended) in a directory it controls,
    named by every variable that could plausibly steer the library: the mounted one still
    rules."""
    d = container(env, feedbackfile.encode(1, True), sm=50)
    other = env.tmp / "mine"
    other.mkdir()
    (other / "feedback").write_bytes(feedbackfile.encode(0, False))
    env.run("init", **preload(d), **BUSY)  # creates the stub state with busy launches
    kv = {k: v.format(other=other) for k, v in ENV_TRIES.items()}
    kv["LD_LIBRARY_PATH"] = f"{other}:{env.build / 'stub'}"
    fb = str(d / feedbackfile.FEEDBACK_FILE)
    _stays_blocked(env, d, lambda: feedbackfile.write(fb, 1, False), **kv)


def test_without_a_feedback_file_the_region_fields_apply(env: Env) -> None:
    """HAMi compatibility: no file, so the region's recent_kernel = -1 blocks until the
    monitor clears it there, and its utilization_switch = 0 lets launches run free."""
    d = container(env, None, sm=50)
    env.run("init", **preload(d), **BUSY)  # creates the stub state with busy launches
    _set(env, "recent_kernel", -1)
    p = env.popen("init", "echo", "ready", "launch", "3", "1", "echo", "done", **preload(d))
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        assert p.poll() is None
        _set(env, "recent_kernel", 0)
        out, _ = p.communicate(timeout=30)
        assert "launched 3" in out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    d = container(env, None, sm=10)
    _set(env, "utilization_switch", 0)
    p = env.run("init", *FREE, **preload(d), **BUSY)
    assert steady_busy_percent(p.stdout) > 60, p.stdout


def test_a_damaged_feedback_file_keeps_launches_limited(env: Env) -> None:
    """A file that is there but not a feedback file (wrong magic) is read as "limited":
    the region's switch = 0 does not lift the limit."""
    d = container(env, b"XXXX" + feedbackfile.encode(0, False)[4:])
    env.run("init", **preload(d), **BUSY)  # creates the stub state with busy launches
    _set(env, "utilization_switch", 0)
    p = env.run("init", *STEADY, **preload(d), **BUSY)
    assert steady_busy_percent(p.stdout) < 50, p.stdout
    assert "not a version 1 feedback file" in p.stderr


def test_the_blocked_launch_does_not_finish_on_its_own(env: Env) -> None:
    """With the file saying blocked and the region saying launch, a launch is still
    waiting when its run is killed after 3 s (no release at all)."""
    d = container(env, feedbackfile.encode(1, True), sm=50)
    env.run("init", **preload(d), **BUSY)  # creates the stub state with busy launches
    _set(env, "recent_kernel", 2)
    with pytest.raises(subprocess.TimeoutExpired) as info:
        env.run("init", "launch", "1", "1", "echo", "done", timeout=3, **preload(d))
    assert "done" not in (info.value.stdout or "")
