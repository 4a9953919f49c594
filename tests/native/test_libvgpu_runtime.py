"""Interposition mechanics, threads, PID namespaces, logging, link flags."""

from __future__ import annotations

import shutil
import struct
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from libvgpu_harness import STEADY, Env, lines, steady_busy_percent

from hami.monitor import region as reg

pytestmark = pytest.mark.native

MiB = 1 << 20
LIMIT = 48 * MiB


def test_rtld_next_resolves_relative_to_the_caller(env: Env) -> None:
    """Another preloaded interposer's dlsym(RTLD_NEXT) finds libc, not itself."""
    pre = f"{env.build / 'libvgpu.so'}:{env.build / 'tests' / 'libinterposer.so'}"
    p = env.run("uid", LD_PRELOAD=pre)
    uid = subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip()
    assert lines(p.stdout, "uid")[0] == [int(uid)]


def test_threads_share_accounting_and_race_for_the_limit(env: Env) -> None:
    p = env.run("init", "threads", "4", "5000", "4096", "info", "race", "8", str(LIMIT // 3 + 1), "info",
                CUDA_DEVICE_MEMORY_LIMIT="48m")
    info = lines(p.stdout, "info")
    assert info[0][0] == LIMIT  # every free accounted
    assert lines(p.stdout, "race")[0] == [2]  # never 3 x (limit/3 + 1)
    assert info[1][0] == LIMIT - 2 * (LIMIT // 3 + 1)


def test_host_pid_differs_from_container_pid(env: Env) -> None:
    """NVML reports host PIDs (PID namespace): detection by process-list delta still finds ours."""
    holder = env.popen("init", "echo", "up", "hold", CUDA_DEVICE_SM_LIMIT="30", VGPU_STUB_PID_OFFSET="100000")
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        r = reg.parse_region(env.region_path.read_bytes())
        (slot,) = r.active_procs()
        assert slot.pid == holder.pid and slot.host_pid == holder.pid + 100000
    finally:
        holder.kill()
        holder.wait()
    p = env.run("init", *STEADY, VGPU_STUB_PID_OFFSET="100000",
                VGPU_STUB_NS_PER_BLOCK="10000", VGPU_STUB_STATE=str(env.tmp / "busy.state"))
    # throttled (unlimited: about 99 % busy, test_libvgpu_compute.py): utilisation is
    # attributed via the host PID
    assert steady_busy_percent(p.stdout) <= 45, p.stdout


def test_nvml_only_process_takes_no_slot(env: Env) -> None:
    p = env.run("nvml", "0", CUDA_DEVICE_MEMORY_LIMIT="48m")
    assert lines(p.stdout, "nvml")[0] == [0, LIMIT, 0, LIMIT]
    r = reg.parse_region(env.region_path.read_bytes())
    assert r.active_procs() == () and r.uuids[0].startswith("GPU-")


def test_log_levels(env: Env) -> None:
    over = ["init", "alloc", "mem", str(LIMIT + 1), "2"]
    quiet = env.run(*over, CUDA_DEVICE_MEMORY_LIMIT="48m", LIBCUDA_LOG_LEVEL="0")
    assert quiet.stderr == ""
    default = env.run(*over, CUDA_DEVICE_MEMORY_LIMIT="48m")
    assert "[HAMI-core Warn(" in default.stderr and "would exceed the limit" in default.stderr
    debug = env.run(*over, CUDA_DEVICE_MEMORY_LIMIT="48m", LIBCUDA_LOG_LEVEL="4")
    assert "[HAMI-core Debug(" in debug.stderr
    err = env.run("init", CUDA_DEVICE_MEMORY_LIMIT_0="nonsense", LIBCUDA_LOG_LEVEL="0",
                  CUDA_DEVICE_MEMORY_SHARED_CACHE=str(env.tmp / "e.cache"))
    assert "[HAMI-core ERROR (pid:" in err.stderr


def test_unusable_region_path_fails_closed(env: Env) -> None:
    """Without the shared region each process would have the whole limit to itself: a
    limited container refuses device allocations; an unlimited one runs uncounted."""
    p = env.run("init", "alloc", "mem", str(LIMIT + 1), "2", "alloc", "mem", "4096", "2",
                CUDA_DEVICE_MEMORY_LIMIT="48m", CUDA_DEVICE_MEMORY_SHARED_CACHE="/nonexistent/dir/x.cache")
    assert "refusing every device allocation" in p.stderr
    p = env.run("init", "alloc", "mem", str(LIMIT + 1), "0",
                CUDA_DEVICE_MEMORY_SHARED_CACHE="/nonexistent/dir/x.cache")
    assert "refusing" not in p.stderr


def test_first_process_fixes_the_limits(env: Env) -> None:
    env.run("init", CUDA_DEVICE_MEMORY_LIMIT="48m")
    p = env.run("init", "info", CUDA_DEVICE_MEMORY_LIMIT="96m")
    assert lines(p.stdout, "info")[0][1] == LIMIT and "the region wins" in p.stderr


@pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf")
def test_link_flags(env: Env) -> None:
    dyn = subprocess.run(["readelf", "-d", str(env.build / "libvgpu.so")], capture_output=True, text=True).stdout
    assert "SYMBOLIC" in dyn and "NODELETE" in dyn
    assert "libcuda" not in dyn and "libnvidia-ml" not in dyn  # no DT_NEEDED on the driver
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", str(env.build / "libvgpu.so")], capture_output=True,
                          text=True).stdout
    exported = {ln.split()[-1] for ln in syms.splitlines() if " GLOBAL " in ln and " UND " not in ln}
    assert {"dlsym", "cuMemAlloc_v2", "cuGetProcAddress_v2", "nvmlDeviceGetMemoryInfo"} <= exported
    assert not any(s.startswith("vg_") for s in exported)  # internals stay hidden
    stub = subprocess.run(["readelf", "-d", str(env.build / "stub" / "libcuda.so.1")], capture_output=True,
                          text=True).stdout
    assert "SYMBOLIC" in stub and "libcuda.so.1" in stub


@settings(max_examples=40, deadline=None)
@given(
    limits=st.lists(st.integers(0, 2**64 - 1), min_size=16, max_size=16),
    slots=st.lists(st.tuples(st.integers(1, 2**31 - 1), st.integers(0, 2**31 - 1), st.integers(0, 2),
                             st.integers(0, 2**40)), max_size=6),
    rk=st.integers(-1, 2),
)
def test_reader_roundtrip(limits: list[int], slots: list[tuple[int, int, int, int]], rk: int) -> None:
    lay = reg._V1
    buf = bytearray(reg.V1_SIZE + 1)
    struct.pack_into("<iII", buf, 0, reg.MAGIC, 1, 2)
    struct.pack_into("<Q", buf, lay.off_device_num, 2)
    struct.pack_into("<16Q", buf, lay.off_limit, *limits)
    for i, (pid, hpid, status, used) in enumerate(slots):
        base = lay.off_procs + i * lay.slot_size
        struct.pack_into("<ii", buf, base, pid, hpid)
        struct.pack_into("<5Q", buf, base + 8 + 64, 0, 0, used, 0, used)  # device 1
        struct.pack_into("<i", buf, base + lay.off_slot_status, status)
    struct.pack_into("<4i", buf, lay.off_proc_num, len(slots), 1, rk, 1)
    r = reg.parse_region(buf)
    assert r.limit_bytes == tuple(limits) and r.recent_kernel == rk and r.proc_num == len(slots)
    assert r.used_memory_bytes(1) == sum(u for _, _, s, u in slots if s != 0)
    assert [(p.pid, p.host_pid, p.status) for p in r.procs] == [(a, b, c) for a, b, c, _ in slots]
