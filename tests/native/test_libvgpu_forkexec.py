"""``fork`` after init and ``exec`` in a child keep one accounting (issue 26 §3).

A forked child (a data-loader worker, a launcher) owns none of its parent's device
objects: it takes its own slot on its first call, is held to the container's limit with
the parent's usage counted, and its usage leaves with it. A child that execs (torchrun
starting a rank with its own ``CUDA_VISIBLE_DEVICES``) starts the library afresh in the
same region, on the card its mask names.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from libvgpu_harness import Env, MiB, lines, until

from hami.monitor import region as reg

pytestmark = pytest.mark.native

LIMITS = {"CUDA_DEVICE_MEMORY_LIMIT_0": "48m", "CUDA_DEVICE_MEMORY_LIMIT_1": "16m"}


def _region(env: Env) -> reg.Region:
    return reg.parse_region(env.region_path.read_bytes())


def test_fork_after_init_counts_parent_and_child_once_each(env: Env) -> None:
    p = env.popen("init", "alloc", "mem", str(10 * MiB), "0",
                  "fork", "init", "alloc", "mem", str(38 * MiB + 1), "2", "alloc", "mem", str(38 * MiB), "0",
                  "info", "--",
                  "info", "alloc", "mem", str(38 * MiB), "0", "info", "echo", "done", "hold", **LIMITS)
    try:
        out = until(p, "done")
        info = [i[:2] for i in lines(out, "info")]
        # the child: the parent's 10 MiB counted once; the parent after the child left
        assert info == [[0, 48 * MiB], [38 * MiB, 48 * MiB], [0, 48 * MiB]], out
        r = _region(env)
        (slot,) = r.active_procs()
        assert slot.pid == p.pid and r.used_memory_bytes(0) == 48 * MiB
    finally:
        p.kill()
        p.wait()


def test_exec_in_a_child_keeps_one_accounting_on_the_card_its_mask_names(env: Env) -> None:
    """The launcher holds 10 MiB on card 0 and execs a rank with CUDA_VISIBLE_DEVICES=1:
    the rank's device 0 is card 1 (16 MiB limit); NVML and the region count each card once."""
    p = env.popen("init", "alloc", "mem", str(10 * MiB), "0", "setenv", "CUDA_VISIBLE_DEVICES", "1",
                  "exec", "init", "alloc", "mem", str(16 * MiB + 1), "2", "alloc", "mem", str(16 * MiB), "0",
                  "info", "nvml", "0", "nvml", "1", "--",
                  "info", "dev", "1", "info", "echo", "done", "hold", **LIMITS)
    try:
        out = until(p, "done")
        info = [i[:2] for i in lines(out, "info")]
        assert info[0] == [0, 16 * MiB], out  # the rank, on card 1
        nvml = lines(out, "nvml")
        assert nvml[0] == [0, 48 * MiB, 10 * MiB, 38 * MiB] and nvml[1] == [1, 16 * MiB, 16 * MiB, 0], out
        # the launcher after the rank exited: its 10 MiB on card 0, card 1 free again
        assert info[1:] == [[38 * MiB, 48 * MiB], [16 * MiB, 16 * MiB]], out
        r = _region(env)
        assert (r.used_memory_bytes(0), r.used_memory_bytes(1)) == (10 * MiB, 0)
        assert [s.pid for s in r.active_procs()] == [p.pid]
    finally:
        p.kill()
        p.wait()


def _tasks(out: str) -> list[list[str]]:
    """The thread names of each ``tasks`` command, in order."""
    groups: list[list[str]] = []
    for ln in out.splitlines():
        if ln == "echo-tasks":
            groups.append([])
        elif ln.startswith("task ") and groups:
            groups[-1].append(ln[5:])
    return groups


def test_watcher_has_started_when_cuinit_returns_and_a_fork_child_has_none(env: Env) -> None:
    """Every new thread is held 300 ms in its start-up (a preloaded pthread_create,
    ``tests/slowstart.c``), where glibc and ASan allocate: a fork in that window once
    left the child with the sanitizer allocator's lock held and its exit hung. cuInit
    returns only once the watcher runs the library's code, so a fork right after it
    cannot catch the watcher starting; the child has no watcher until its own init."""
    pre = f"{env.build / 'tests' / 'libslowstart.so'}:{env.build / 'libvgpu.so'}"
    tasks = ["echo", "echo-tasks", "tasks"]
    p = env.run("init", *tasks, "fork", *tasks, "init", *tasks, "--", *tasks, LD_PRELOAD=pre,
                CUDA_DEVICE_SM_LIMIT="50")
    parent, child_before, child_after, parent_after = _tasks(p.stdout)
    assert parent.count("vgpu-watcher") == 1, p.stdout
    assert child_before == ["vgtest"], p.stdout
    assert child_after.count("vgpu-watcher") == 1, p.stdout
    assert parent_after.count("vgpu-watcher") == 1, p.stdout


def test_fork_while_watchers_start_every_child_exits(env: Env) -> None:
    """100 children each start their watcher (held 20 ms in start-up) and fork at once;
    every child and grandchild exits (a stuck one is killed after 30 s and counted)."""
    pre = f"{env.build / 'tests' / 'libslowstart.so'}:{env.build / 'libvgpu.so'}"
    p = env.run("init", "forkstorm", "100", LD_PRELOAD=pre, SLOWSTART_MS="20", CUDA_DEVICE_SM_LIMIT="50",
                timeout=600)
    assert lines(p.stdout, "forkstorm") == [[100, 0]], p.stdout + p.stderr


def test_harness_timeout_kills_a_hung_forked_child(env: Env) -> None:
    """A test run that times out leaves nothing behind: the forked child that holds
    (as a child hung at exit would) is killed with its parent."""
    token = f"{env.tmp}/hung-child-token"
    with pytest.raises(subprocess.TimeoutExpired):
        env.run("echo", token, "fork", "hold", timeout=3)
    left = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and token.encode() in (proc / "cmdline").read_bytes():
                left.append(proc.name)
        except OSError:
            continue
    assert left == []
