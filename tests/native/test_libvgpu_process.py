"""Shared limit across processes, dead-process reclaim, region layout, cudart-style lookup, field cases."""

from __future__ import annotations

import mmap
import os
import signal
import struct
import subprocess

import pytest
from libvgpu_harness import Env, lines

from hami.monitor import region as reg

pytestmark = pytest.mark.native

MiB = 1 << 20
LIMIT = 48 * MiB


def _wait_line(p: subprocess.Popen[str], text: str) -> None:
    assert p.stdout is not None
    for line in p.stdout:
        if text in line:
            return
    raise AssertionError(f"{text!r} never printed; stderr: {p.stderr.read() if p.stderr else ''}")


def test_processes_share_one_limit_and_killed_memory_returns(env: Env) -> None:
    holder = env.popen("init", "alloc", "mem", str(32 * MiB), "0", "hold", CUDA_DEVICE_MEMORY_LIMIT="48m")
    try:
        _wait_line(holder, "holding")
        p = env.run("init", "alloc", "mem", str(16 * MiB + 1), "2", "alloc", "mem", str(16 * MiB), "0", "info",
                    "nvml", "0")
        assert lines(p.stdout, "info")[0][:2] == [0, LIMIT]
        assert lines(p.stdout, "nvml")[0] == [0, LIMIT, LIMIT, 0]
        r = reg.parse_region(env.region_path.read_bytes())
        assert r.used_memory_bytes(0) == 32 * MiB  # the second process exited cleanly
        assert [s.pid for s in r.active_procs()] == [holder.pid]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    p = env.run("init", "alloc", "mem", str(LIMIT), "0", "info")
    assert lines(p.stdout, "info")[0][:2] == [0, LIMIT]


def test_three_processes_and_fork(env: Env) -> None:
    holders = [env.popen("init", "alloc", "mem", str(10 * MiB), "0", "hold", CUDA_DEVICE_MEMORY_LIMIT="48m")
               for _ in range(2)]
    try:
        for h in holders:
            _wait_line(h, "holding")
        # parent holds 10 MiB; its forked child sees 30 MiB in use
        p = env.run("init", "alloc", "mem", str(10 * MiB), "0", "fork", "init", "alloc", "mem",
                    str(18 * MiB + 1), "2", "alloc", "mem", str(18 * MiB), "0", "info")
        assert lines(p.stdout, "info")[0][:2] == [0, LIMIT]
    finally:
        for h in holders:
            h.kill()
            h.wait()


def test_region_matches_python_reader(env: Env) -> None:
    holder = env.popen("init", "alloc", "mem", str(5 * MiB), "0", "alloc", "vmm", str(7 * MiB), "0",
                       "dev", "1", "alloc", "managed", str(3 * MiB), "0", "hold",
                       CUDA_DEVICE_MEMORY_LIMIT="48m", CUDA_DEVICE_SM_LIMIT="30", CUDA_TASK_PRIORITY="0")
    try:
        _wait_line(holder, "holding")
        data = env.region_path.read_bytes()
        assert len(data) == reg.V1_SIZE + 1
        r = reg.parse_region(data)
        assert r.version == (1, 2)
        assert r.device_count == 2
        assert r.uuids[1] == "GPU-5a1e0000-0000-4000-8000-000000000001"
        assert r.limit_bytes[:2] == (LIMIT, LIMIT) and r.sm_limit_percent[0] == 30
        assert r.priority == 0 and r.utilization_switch == 1
        (slot,) = r.active_procs()
        assert slot.pid == holder.pid and slot.host_pid == holder.pid and slot.status == 1
        assert r.used_memory_bytes(0) == 12 * MiB and r.data_bytes(0) == 12 * MiB
        assert r.used_memory_bytes(1) == 3 * MiB
    finally:
        holder.kill()
        holder.wait()


def test_layout_offsets_match_c(env: Env) -> None:
    out = env.run(prog="layout_dump", preload=False).stdout
    c = {k: int(v) for k, v in (ln.split() for ln in out.splitlines())}
    lay = reg._V1
    assert c["sizeof.region"] == reg.V1_SIZE == lay.size
    assert c["region.device_num"] == lay.off_device_num
    assert c["region.uuids"] == lay.off_uuids
    assert c["region.limit"] == lay.off_limit
    assert c["region.sm_limit"] == lay.off_sm_limit
    assert c["region.procs"] == lay.off_procs
    assert c["region.proc_num"] == lay.off_proc_num
    assert c["region.last_kernel_time"] == lay.off_last_kernel_time
    assert c["region.recent_kernel"] == reg.V1_OFFSETS["recent_kernel"]
    assert c["region.utilization_switch"] == reg.V1_OFFSETS["utilization_switch"]
    assert c["sizeof.slot"] == lay.slot_size
    assert c["slot.monitorused"] == lay.off_slot_monitorused
    assert c["slot.device_util"] == lay.off_slot_util
    assert c["slot.status"] == lay.off_slot_status
    assert c["devmem.total"] == 32 and c["devutil.sm_util"] == 16


def test_fake_runtime_cuda12_and_b28_cuda11(env: Env) -> None:
    """B28: entry points via cuGetProcAddress (11.x) and _v2 (12.x); wrappers for hooked, real for the rest."""
    for mode in ("12", "11"):
        p = env.run(mode, str(1024 * MiB), prog="fake_runtime", CUDA_DEVICE_MEMORY_LIMIT="1g",
                    CUDA_DEVICE_MEMORY_SHARED_CACHE=str(env.tmp / f"rt{mode}.cache"))
        assert "fake_runtime ok" in p.stdout


def test_b26_stale_and_overcounted_usage(env: Env) -> None:
    """B26: usage above the limit is clamped (no wrap) and slots of dead processes are reclaimed."""
    env.run("init", "info", CUDA_DEVICE_MEMORY_LIMIT="48m")
    dead = subprocess.Popen(["true"])
    dead.wait()
    with open(env.region_path, "r+b") as f, mmap.mmap(f.fileno(), reg.V1_SIZE) as m:
        n = struct.unpack_from("<i", m, reg._V1.off_proc_num)[0]
        slot = reg._V1.off_procs + n * reg._V1.slot_size
        struct.pack_into("<ii", m, slot, dead.pid, 0)  # a killed process's leftover
        struct.pack_into("<Q", m, slot + 8 + 32, 3 * LIMIT)
        struct.pack_into("<i", m, slot + reg._V1.off_slot_status, 1)
        struct.pack_into("<i", m, reg._V1.off_proc_num, n + 1)
    p = env.run("nvml", "0", "init", "info", "alloc", "mem", str(LIMIT), "0")
    assert lines(p.stdout, "nvml")[0] == [0, LIMIT, 0, LIMIT]
    assert lines(p.stdout, "info")[0][:2] == [LIMIT, LIMIT]
    # a live process over-counted: clamped, never a wrapped free
    with open(env.region_path, "r+b") as f, mmap.mmap(f.fileno(), reg.V1_SIZE) as m:
        slot = reg._V1.off_procs
        struct.pack_into("<ii", m, slot, os.getpid(), 0)
        struct.pack_into("<Q", m, slot + 8 + 32, 2 * LIMIT)
        struct.pack_into("<i", m, slot + reg._V1.off_slot_status, 1)
        struct.pack_into("<i", m, reg._V1.off_proc_num, max(1, struct.unpack_from("<i", m, reg._V1.off_proc_num)[0]))
    p = env.run("nvml", "0", "init", "info", "alloc", "mem", "1", "2")
    assert lines(p.stdout, "nvml")[0] == [0, LIMIT, LIMIT, 0]
    assert lines(p.stdout, "info")[0] == [0, LIMIT, 0]  # CUDA_SUCCESS, not INVALID_VALUE


def test_reader_rejects_bad_files() -> None:
    with pytest.raises(reg.RegionError):
        reg.parse_region(b"\0" * 100)
    with pytest.raises(reg.RegionError):
        reg.parse_region(b"")
    good = bytearray(reg.V1_SIZE)
    struct.pack_into("<iII", good, 0, reg.MAGIC, 1, 2)
    assert reg.parse_region(good).proc_num == 0
    with pytest.raises(reg.RegionError):
        reg.parse_region(good[: reg.V1_SIZE - 10][: reg.V0_SIZE - 1])
    bad = bytearray(good)
    struct.pack_into("<i", bad, reg._V1.off_proc_num, 5000)
    with pytest.raises(ValueError):
        reg.parse_region(bad)
    v0 = bytearray(reg.V0_SIZE + 1)
    struct.pack_into("<i", v0, 0, reg.MAGIC)
    struct.pack_into("<Q", v0, 1592, 123)
    struct.pack_into("<i", v0, 1_197_880, 1)
    struct.pack_into("<ii", v0, 1848, 42, 4242)
    struct.pack_into("<Q", v0, 1848 + 8 + 32, 77)  # used[0].total in a 40-byte record
    struct.pack_into("<i", v0, 1848 + 1160, 1)
    r0 = reg.parse_region(v0)
    assert r0.version == (0, 0) and r0.limit_bytes[0] == 123 and r0.used_memory_bytes(0) == 77
    assert r0.procs[0].host_pid == 4242
