"""libvgpu fails closed (issue 12 §4) on the stub driver.

A "container" here is a directory holding a copy of libvgpu.so and, as the device
plugin mounts it read-only next to the library, ``limits.env``. Processes that lost
their environment (``env -i`` with only the preload kept, as sudo and cron do), that
set a larger limit, that meet a region of another version or a full region never run
with more than the container's limit. The node-wide host-PID detection lock is gone:
a process holding ``/tmp/vgpulock/lock`` delays no one, and concurrent detection on a
shared GPU still attributes each process its own host PID."""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest
from libvgpu_harness import Env, lines

from hami.monitor import region as reg

pytestmark = pytest.mark.native

MiB = 1 << 20
LIMIT = 48 * MiB


def container(env: Env, limits: str | None) -> Path:
    """The container's ``<H>/vgpu``: the library and, unless None, its limits file."""
    d = env.tmp / "vgpu"
    d.mkdir(exist_ok=True)
    shutil.copy(env.build / "libvgpu.so", d / "libvgpu.so")
    if limits is not None:
        (d / "limits.env").write_text(limits)
    return d


def bare(env: Env, lib_dir: Path, *args: str, **kv: str) -> subprocess.CompletedProcess[str]:
    """vgtest with nothing in its environment but the preload and what the stub driver
    needs (in a container the driver is on the default library path)."""
    e = {"LD_PRELOAD": str(lib_dir / "libvgpu.so"), "LD_LIBRARY_PATH": str(env.build / "stub"),
         "VGPU_STUB_STATE": str(env.tmp / "stub.state"), **kv}
    return subprocess.run([str(env.build / "tests" / "vgtest"), *args], env=e, capture_output=True,
                          text=True, timeout=60)


def results(p: subprocess.CompletedProcess[str]) -> list[int]:
    """The return codes vgtest printed for its ``alloc`` commands."""
    return [int(ln.rsplit(" ", 1)[1]) for ln in p.stdout.splitlines() if ln.startswith("alloc ")]


def plugin_limits(d: Path, limit: str = "48m") -> str:
    return (f"CUDA_DEVICE_MEMORY_LIMIT_0={limit}\nCUDA_DEVICE_MEMORY_LIMIT_1={limit}\n"
            f"CUDA_DEVICE_SM_LIMIT=30\nCUDA_DEVICE_MEMORY_SHARED_CACHE={d}/c0ffee.cache\n")


def test_env_less_process_keeps_the_mounted_limit_and_shares_the_region(env: Env) -> None:
    d = env.tmp / "vgpu"
    lib = container(env, plugin_limits(d))
    holder = subprocess.Popen([str(env.build / "tests" / "vgtest"), "init", "alloc", "mem", str(32 * MiB), "0",
                               "hold"], env=env.environ(LD_PRELOAD=str(lib / "libvgpu.so"),
                                                        CUDA_DEVICE_MEMORY_LIMIT_0="48m",
                                                        CUDA_DEVICE_MEMORY_SHARED_CACHE=str(d / "c0ffee.cache")),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and "holding" in holder.stdout.readline() + holder.stdout.readline()
        p = bare(env, lib, "init", "alloc", "mem", str(16 * MiB + 1), "-1", "alloc", "mem", str(16 * MiB), "-1")
        assert results(p) == [2, 0], p.stdout + p.stderr
        r = reg.parse_region((d / "c0ffee.cache").read_bytes())
        assert r.limit_bytes[:2] == (LIMIT, LIMIT)
    finally:
        holder.kill()
        holder.wait()
    p = bare(env, lib, "init", "alloc", "mem", str(LIMIT + 1), "-1", "alloc", "mem", str(LIMIT), "-1",
             "nvml", "0")
    assert results(p) == [2, 0]
    assert lines(p.stdout, "nvml")[0][1] == LIMIT


def test_environment_cannot_raise_or_escape_the_mounted_limit(env: Env) -> None:
    d = env.tmp / "vgpu"
    lib = container(env, plugin_limits(d))
    elsewhere = env.tmp / "own.cache"
    p = bare(env, lib, "init", "alloc", "mem", str(LIMIT + 1), "-1", "dev", "1", "alloc", "mem",
             str(LIMIT + 1), "-1", CUDA_DEVICE_MEMORY_LIMIT_0="96m", CUDA_DEVICE_MEMORY_LIMIT="1t",
             CUDA_DEVICE_MEMORY_SHARED_CACHE=str(elsewhere), CUDA_DEVICE_SM_LIMIT="100")
    assert results(p) == [2, 2], p.stdout + p.stderr
    assert "the mounted one applies" in p.stderr
    assert not elsewhere.exists()  # the container's region, not one of its own
    assert reg.parse_region((d / "c0ffee.cache").read_bytes()).sm_limit_percent[0] == 30
    p = bare(env, lib, "init", "alloc", "mem", str(32 * MiB + 1), "-1", CUDA_DEVICE_MEMORY_LIMIT_0="32m")
    assert results(p) == [2]  # lowering is allowed


@pytest.mark.parametrize("content", ["CUDA_DEVICE_MEMORY_LIMIT_0=lots\n", "", "no equals sign\n", None])
def test_damaged_limits_file_refuses_allocations(env: Env, content: str | None) -> None:
    lib = container(env, content)
    if content is None:
        (lib / "limits.env").mkdir()  # present but not a readable file
    p = bare(env, lib, "init", "alloc", "mem", "4096", "-1", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(env.region_path))
    assert results(p) == [2] and "refusing every device allocation" in p.stderr


def test_wrong_version_region_gives_no_process_the_whole_limit(env: Env) -> None:
    """HAMi-core and the previous libvgpu fell back to a private region with the full
    limit in every process; two processes then had twice the limit."""
    buf = bytearray(reg.V1_SIZE + 1)
    struct.pack_into("<iII", buf, 0, reg.MAGIC, 2, 0)
    env.region_path.write_bytes(bytes(buf))
    p = env.run("init", "alloc", "mem", str(LIMIT), "-1", CUDA_DEVICE_MEMORY_LIMIT="48m")
    assert results(p) == [2] and "refusing every device allocation" in p.stderr
    assert env.region_path.read_bytes() == bytes(buf)  # the foreign region is left alone


def test_full_region_never_lets_a_process_run_uncounted(env: Env) -> None:
    env.run("init", CUDA_DEVICE_MEMORY_LIMIT="48m")
    lay = reg._V1
    with open(env.region_path, "r+b") as f, mmap.mmap(f.fileno(), reg.V1_SIZE) as m:
        for i in range(reg.MAX_PROCS):  # every slot held by a live process (this one)
            base = lay.off_procs + i * lay.slot_size
            struct.pack_into("<ii", m, base, os.getpid(), 0)
            struct.pack_into("<i", m, base + lay.off_slot_status, 1)
        struct.pack_into("<i", m, lay.off_proc_num, reg.MAX_PROCS)
    p = env.run("init", "alloc", "mem", str(40 * MiB), "-1", "alloc", "mem", str(40 * MiB), "-1",
                CUDA_DEVICE_MEMORY_LIMIT="48m")
    assert results(p) == [2, 2], p.stdout + p.stderr
    assert "shared region full" in p.stderr


# --- the node-wide lock ----------------------------------------------------------------------

def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_mount_ns = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None or not _can_unshare(),
                                    reason="needs root and unshare -m to give the process its own /tmp/vgpulock")


def in_node_ns(env: Env, lockdir: Path, *args: str, **kv: str) -> subprocess.Popen[str]:
    """vgtest in a private mount namespace where ``lockdir`` is ``/tmp/vgpulock`` (the
    host's /tmp is not touched: the namespace gets its own /tmp with the test dir and the
    build dir bound back when they live under /tmp, as a checkout in /tmp does)."""
    keep = " ".join(str(p) for p in (env.tmp, env.build))
    script = ('set -e; mount --make-rprivate /; mount --bind /tmp /mnt; mount -t tmpfs tmpfs /tmp; '
              'for p in $KEEP; do case "$p" in /tmp/*) mkdir -p "$p"; '
              'mount --bind "/mnt${p#/tmp}" "$p";; esac; done; '
              'mkdir -p /tmp/vgpulock; mount --bind "$L" /tmp/vgpulock; exec "$@"')
    e = env.environ(KEEP=keep, L=str(lockdir), **kv)
    return subprocess.Popen(["unshare", "-m", "sh", "-c", script, "sh", str(env.build / "tests" / "vgtest"),
                             *args], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")


def _host_pid_of(env: Env, region: Path, proc: subprocess.Popen[str], timeout_s: float = 30) -> tuple[float, int]:
    """Seconds until ``proc`` printed "up", and the host PID its slot records."""
    t0 = time.monotonic()
    assert proc.stdout is not None
    line = proc.stdout.readline()
    took = time.monotonic() - t0
    assert line.strip() == "up", proc.stderr.read() if proc.stderr else ""
    (slot,) = [s for s in reg.parse_region(region.read_bytes()).active_procs() if s.pid == proc.pid]
    return took, slot.host_pid


class OpenWatch:
    """inotify (``IN_OPEN``) on a directory: the names of the files in it that any
    process opened, through any mount of it, since the watch was made. ``inotify(7)``;
    the events are read without blocking."""

    _IN_OPEN = 0x20
    _HEADER = struct.Struct("iIII")  # wd, mask, cookie, len of the name that follows

    def __init__(self, directory: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, os.fsencode(directory), self._IN_OPEN) < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {directory}")

    def opened(self) -> list[str]:
        names: list[str] = []
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return names
            off = 0
            while off < len(buf):
                _, mask, _, size = self._HEADER.unpack_from(buf, off)
                off += self._HEADER.size
                if mask & self._IN_OPEN:
                    names.append(buf[off:off + size].rstrip(b"\0").decode() or ".")
                off += size

    def close(self) -> None:
        os.close(self.fd)


@needs_mount_ns
def test_a_held_node_lock_does_not_delay_anyone(env: Env) -> None:
    """A tenant holding /tmp/vgpulock/lock (HAMi mounts one host directory into every GPU
    container) stalled every other container's first CUDA call by 10 s. With the lock held
    the first CUDA call returns and the host PID is right, and the library never opened
    anything in /tmp/vgpulock: it cannot wait on that lock (asserted without a wall-clock
    threshold, which a loaded machine could cross)."""
    lockdir = env.tmp / "vgpulock"
    lockdir.mkdir()
    with open(lockdir / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        watch = OpenWatch(lockdir)
        p = in_node_ns(env, lockdir, "init", "echo", "up", "hold", CUDA_DEVICE_SM_LIMIT="30",
                       VGPU_STUB_PID_OFFSET="100000")
        try:
            took, host_pid = _host_pid_of(env, env.region_path, p)
            assert host_pid == p.pid + 100000
            assert watch.opened() == [], f"libvgpu opened the node lock (first CUDA call after {took:.1f} s)"
        finally:
            watch.close()
            p.kill()
            p.wait()


@needs_mount_ns
def test_concurrent_detection_on_a_shared_gpu_finds_each_its_own_pid(env: Env) -> None:
    """Two containers (own regions) on one GPU create their contexts at the same time; NVML
    lists the newest process first. Without a node-wide lock a round that sees two new
    PIDs is retried instead of taking the first one (which is the other container's)."""
    lockdir = env.tmp / "vgpulock"
    lockdir.mkdir()
    common = {"CUDA_DEVICE_SM_LIMIT": "30", "VGPU_STUB_PID_OFFSET": "100000", "VGPU_STUB_NVML_REVERSE": "1",
              "VGPU_STUB_RETAIN_DELAY_MS": "1500"}
    a = in_node_ns(env, lockdir, "init", "echo", "up", "hold",
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=str(env.tmp / "a.cache"), **common)
    time.sleep(0.4)
    b = in_node_ns(env, lockdir, "init", "echo", "up", "hold",
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=str(env.tmp / "b.cache"), **common)
    try:
        _, pid_a = _host_pid_of(env, env.tmp / "a.cache", a)
        _, pid_b = _host_pid_of(env, env.tmp / "b.cache", b)
        assert (pid_a, pid_b) == (a.pid + 100000, b.pid + 100000)
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
