"""VMM memory shared between processes of a container (issue 26 §3): process A creates
and exports an allocation (cuMemCreate, cuMemExportToShareableHandle), process B imports
and maps it. The creator pays while it holds the memory; when its last reference goes
(release, exit or kill -9) while B still holds it, B pays until B's own last reference
(native/libvgpu/src/vmmshare.c). The records that say who pays sit in the region's unused
words; the attacker tests write them as a tenant can.

``info`` is cuMemGetInfo through libvgpu (free, total of the 48 MiB slice); ``phys N``
is what the stub's device really holds.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from libvgpu_harness import (
    BUILD,
    LIM,
    LIMIT,
    OOM,
    VALGRIND,
    Env,
    MiB,
    build,
    free_of,
    lines,
    phys_of,
)

pytestmark = pytest.mark.native

class Proc:
    """A vgtest process the test steps through its ``wait`` commands."""

    def __init__(self, env: Env, args: tuple[str, ...], pre: tuple[str, ...] = (), fds: tuple[int, ...] = ()) -> None:
        self.p = subprocess.Popen([*pre, str(env.build / "tests" / "vgtest"), *args], env=env.environ(**LIM),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  pass_fds=fds)
        self.out: list[str] = []

    def until(self, word: str) -> str:
        assert self.p.stdout is not None
        start = len(self.out)
        for line in self.p.stdout:
            self.out.append(line)
            if line.strip() == word:
                return "".join(self.out[start:])
        raise AssertionError("".join(self.out) + (self.p.stderr.read() if self.p.stderr else ""))

    def go(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write("\n")
        self.p.stdin.flush()

    def finish(self) -> str:
        out, err = self.p.communicate(timeout=120)
        assert self.p.returncode == 0, "".join(self.out) + out + err
        self.out.append(out)
        return out + err

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.communicate()


@contextmanager
def procs(env: Env, *scripts: tuple[str, ...], pre: tuple[str, ...] = (), fds: tuple[int, ...] = ()
          ) -> Iterator[list[Proc]]:
    """Start one vgtest per script; all are killed on leaving, or after 180 s (a hung
    process then ends the test's reads with its output instead of hanging the run)."""
    started: list[Proc] = []
    watchdog = threading.Timer(180, lambda: [p.p.kill() for p in started])
    watchdog.start()
    try:
        for s in scripts:
            started.append(Proc(env, s, pre, fds))
        yield started
    finally:
        watchdog.cancel()
        for p in started:
            p.stop()


def _creator(env: Env, size: int, *rest: str) -> tuple[str, ...]:
    return ("init", "alloc", "vmm", str(size), "0", "vexport", "echo", "ready", *rest)


def _check(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return env.run("init", "info", "phys", "0", *args, check=False, **LIM)


# ------------------------------------------------------------------------ honest paths
@pytest.mark.parametrize("first", ["creator", "importer"])
def test_shared_allocation_is_counted_once_and_released_exactly_once(env: Env, first: str) -> None:
    """A creates, maps and exports 16 MiB; B imports and maps it. Counted once while both
    hold it, still once after the first of them unmaps and releases (the creator first:
    B pays on), nothing once both did; the region holds no usage after both exit."""
    a_script = ("init", "alloc", "vmm", str(16 * MiB), "0", "vmap", "vexport", "echo", "ready", "wait",
                "vunmap", "free", "info", "echo", "released", "wait")
    with procs(env, a_script) as (a,):
        (pid, fd), = lines(a.until("ready"), "fd")
        b_script = ("init", "vimport", str(pid), str(fd), str(16 * MiB), "0", "vmap", "echo", "imported", "wait",
                    "vunmap", "free", "info", "echo", "released", "wait")
        with procs(env, b_script) as (b,):
            b.until("imported")
            assert free_of(_check(env).stdout) == [32 * MiB]
            one, other = (a, b) if first == "creator" else (b, a)
            one.go()
            assert free_of(one.until("released")) == [32 * MiB]
            c = _check(env, "alloc", "mem", str(32 * MiB + 1), OOM, "alloc", "mem", str(32 * MiB), "0")
            assert c.returncode == 0, c.stdout + c.stderr
            assert free_of(c.stdout) == [32 * MiB] and phys_of(c.stdout) == [16 * MiB]
            other.go()
            assert free_of(other.until("released")) == [LIMIT]
            assert phys_of(_check(env).stdout) == [0]
            one.go()
            other.go()
            a.finish()
            b.finish()
    c = _check(env, "alloc", "mem", str(LIMIT), "0")
    assert c.returncode == 0 and free_of(c.stdout) == [LIMIT] and phys_of(c.stdout) == [0], c.stdout + c.stderr


def test_creator_exiting_normally_leaves_the_memory_to_its_importer(env: Env) -> None:
    """A exits without releasing (its exit handler runs); B's mapping keeps the memory:
    B pays, and its release frees the charge."""
    with procs(env, _creator(env, 16 * MiB, "wait")) as (a,):
        (pid, fd), = lines(a.until("ready"), "fd")
        b_script = ("init", "vimport", str(pid), str(fd), str(16 * MiB), "0", "vmap", "echo", "imported", "wait",
                    "info", "vunmap", "free", "info")
        with procs(env, b_script) as (b,):
            b.until("imported")
            a.go()
            a.finish()
            c = _check(env, "alloc", "mem", str(32 * MiB + 1), OOM)
            assert c.returncode == 0 and free_of(c.stdout) == [32 * MiB] and phys_of(c.stdout) == [16 * MiB]
            b.go()
            assert free_of(b.finish()) == [32 * MiB, LIMIT]
    assert free_of(_check(env).stdout) == [LIMIT]


def test_two_importers_pass_the_charge_on(env: Env) -> None:
    """A exports, B and C import and map; A is killed: one of them pays; that one
    releases: the other pays; the other releases: nothing is counted."""
    with procs(env, _creator(env, 16 * MiB, "hold")) as (a,):
        (pid, fd), = lines(a.until("ready"), "fd")
        imp = ("init", "vimport", str(pid), str(fd), str(16 * MiB), "0", "vmap", "echo", "imported", "wait",
               "vunmap", "free", "echo", "released", "wait")
        with procs(env, imp, imp) as (b, c):
            b.until("imported")
            c.until("imported")
            a.stop()
            for p, left in ((b, 32 * MiB), (c, LIMIT)):
                assert free_of(_check(env).stdout) == [32 * MiB]
                p.go()
                p.until("released")
                assert free_of(_check(env).stdout) == [left]
            b.go()
            c.go()
            b.finish()
            c.finish()


def test_creator_replaced_by_exec_leaves_the_memory_to_its_importer(env: Env) -> None:
    """A execs (same PID, no exit handler; the driver drops the old image's references):
    the new image takes the old image's region slot, and the shared memory's charge goes
    to the importer instead of vanishing with the slot's old contents."""
    # the new image registers through cuDeviceTotalMem (no context: the stub, unlike the
    # driver, keeps the old image's memory under the same PID, which a context-size
    # measurement would see)
    with procs(env, _creator(env, 16 * MiB, "wait", "reexec", "total", "0", "echo", "replaced", "hold")) as (a,):
        (pid, fd), = lines(a.until("ready"), "fd")
        b_script = ("init", "vimport", str(pid), str(fd), str(16 * MiB), "0", "vmap", "echo", "imported", "wait",
                    "vunmap", "free", "info")
        with procs(env, b_script) as (b,):
            b.until("imported")
            a.go()
            a.until("replaced")
            assert _records(env, pid) == [(0, 0, 0)] * 32
            assert [w[1] for w in _records(env, b.p.pid) if w[0] >> 56 == 2] == [16 * MiB]
            assert free_of(_check(env).stdout) == [32 * MiB]
            b.go()
            assert free_of(b.finish()) == [LIMIT]


def test_unlinkable_import_is_counted_by_the_importer_for_what_it_maps(env: Env) -> None:
    """A descriptor the library cannot link to its creator (here reopened through /proc:
    a new open file; on a real node: kcmp refused by seccomp): the importer pays for what
    it maps, checked against the limit (counted twice while the creator also holds it),
    so the creator's exit still leaves the memory counted."""
    with procs(env, _creator(env, 16 * MiB, "hold")) as (a,):
        (pid, fd), = lines(a.until("ready"), "fd")
        b_script = ("init", "vimportproc", str(pid), str(fd), str(16 * MiB), "0", "vprop", "info", "vmap", "info",
                    "echo", "imported", "wait", "vunmap", "free", "info")
        with procs(env, b_script) as (b,):
            out = b.until("imported")
            assert lines(out, "vprop") == [[1, 0]]  # device-located, on device 0
            assert free_of(out) == [32 * MiB, 16 * MiB]
            a.stop()
            c = _check(env, "alloc", "mem", str(32 * MiB + 1), OOM)
            assert c.returncode == 0 and free_of(c.stdout) == [32 * MiB], c.stdout + c.stderr
            b.go()
            assert free_of(b.finish()) == [LIMIT]


def test_fabric_handle_import_is_counted_by_the_importer_for_what_it_maps(env: Env) -> None:
    """A fabric handle (64 bytes, no descriptor to compare) cannot be linked: the importer
    pays for its mapping, so the creator's kill leaves the memory counted."""
    script = ("init", "alloc", "vmm", str(16 * MiB), "0", "vexportfab", "echo", "ready", "hold")
    with procs(env, script) as (a,):
        out = a.until("ready")
        fab = next(ln.split()[1] for ln in out.splitlines() if ln.startswith("fab "))
        b_script = ("init", "vimportfab", fab, str(16 * MiB), "0", "info", "vmap", "info", "echo", "imported",
                    "wait", "vunmap", "free", "info")
        with procs(env, b_script) as (b,):
            assert free_of(b.until("imported")) == [32 * MiB, 16 * MiB]
            a.stop()
            c = _check(env, "alloc", "mem", str(32 * MiB + 1), OOM)
            assert c.returncode == 0 and free_of(c.stdout) == [32 * MiB] and phys_of(c.stdout) == [16 * MiB]
            b.go()
            assert free_of(b.finish()) == [LIMIT]


# ---------------------------------------------------------- the tenant writes the records
def _layout(env: Env) -> dict[str, int]:
    out = env.run(prog="layout_dump", preload=False).stdout
    return {k: int(v) for k, v in (ln.split() for ln in out.splitlines())}


def _record_offset(env: Env, pid: int, rec: int) -> int:
    lay = _layout(env)
    data = env.region_path.read_bytes()
    n = struct.unpack_from("<i", data, lay["region.proc_num"])[0]
    for i in range(n):
        base = lay["region.procs"] + i * lay["sizeof.slot"]
        if struct.unpack_from("<i", data, base + lay["slot.pid"])[0] == pid:
            if rec < 16:
                return base + lay["slot.used"] + rec * lay["sizeof.devmem"] + lay["devmem.total"] + 8
            return base + lay["slot.device_util"] + (rec - 16) * lay["sizeof.devutil"] + lay["devutil.sm_util"] + 8
    raise AssertionError(f"no slot of pid {pid}")


def _records(env: Env, pid: int) -> list[tuple[int, int, int]]:
    data = env.region_path.read_bytes()
    return [struct.unpack_from("<QQQ", data, _record_offset(env, pid, r)) for r in range(32)]


def _poke(env: Env, pid: int, rec: int, words: tuple[int, int, int]) -> None:
    off = _record_offset(env, pid, rec)
    with open(env.region_path, "r+b") as f:
        f.seek(off)
        f.write(struct.pack("<QQQ", *words))


EXPORT, IMPORT = 1 << 56, 2 << 56


def test_forged_records_of_never_exported_handles_change_nothing(env: Env) -> None:
    """Export and import records a tenant writes for allocations that do not exist (any
    fd, a device past the table, huge sizes, paid bytes), in a live and in a dying
    process's slot: the real import links to the real export only, no count goes down,
    and the creator's kill still leaves the importer paying the full limit."""
    with procs(env, ("init", "echo", "ready", "hold"), _creator(env, LIMIT, "hold")) as (x, a):
        x.until("ready")
        xpid = x.p.pid
        (pid, fd), = lines(a.until("ready"), "fd")
        for r, words in enumerate([(EXPORT, 1 << 40, 7 << 32 | 0), (EXPORT | 200 << 48, 1 << 40, 8 << 32 | 1),
                                   (EXPORT, 1, 9 << 32 | 2), (IMPORT | pid, 1 << 40, 1 << 32),
                                   (IMPORT | xpid, LIMIT, 7 << 32)]):
            _poke(env, xpid, r, words)
            _poke(env, pid, 20 + r, words)
        b_script = ("init", "vimport", str(pid), str(fd), str(LIMIT), "0", "vmap", "echo", "imported", "hold")
        with procs(env, b_script) as (b,):
            b.until("imported")
            assert free_of(_check(env, "alloc", "mem", "1", OOM).stdout) == [0]
            x.stop()
            a.stop()
            c = _check(env, "alloc", "vmm", str(LIMIT), OOM, "alloc", "mem", "1", OOM)
            assert c.returncode == 0, c.stdout + c.stderr
            assert phys_of(c.stdout) == [LIMIT] and free_of(c.stdout) == [0]
            assert [w[1] for w in _records(env, b.p.pid) if w[0] >> 56 == 2] == [LIMIT]


def test_a_shrunk_or_deleted_export_record_cannot_lift_the_limit(env: Env) -> None:
    """The tenant rewrites the creator's export record before the import: the size to
    one byte (the importer's mapping sets what it pays at the least), or the whole record
    away (no link: the importer pays for its own mapping, which the limit refuses while
    the creator holds the memory)."""
    with procs(env, _creator(env, LIMIT, "hold")) as (a,):
        (pid, fd), = lines(a.until("ready"), "fd")
        (rec, words), = [(r, w) for r, w in enumerate(_records(env, pid)) if w[0] >> 56 == 1]
        _poke(env, pid, rec, (words[0], 1, words[2]))
        b_script = ("init", "vimport", str(pid), str(fd), str(LIMIT), "0", "vmap", "echo", "imported", "hold")
        with procs(env, b_script) as (b,):
            b.until("imported")
            a.stop()
            c = _check(env, "alloc", "mem", "1", OOM)
            assert c.returncode == 0 and free_of(c.stdout) == [0], c.stdout + c.stderr
    env2 = Env(env.tmp / "deleted", env.build)
    env2.tmp.mkdir()
    with procs(env2, _creator(env2, LIMIT, "hold")) as (a,):
        (pid, fd), = lines(a.until("ready"), "fd")
        (rec, _), = [(r, w) for r, w in enumerate(_records(env2, pid)) if w[0] >> 56 == 1]
        _poke(env2, pid, rec, (0, 0, 0))
        b = env2.run("init", "vimport", str(pid), str(fd), str(LIMIT), "0", "vmap", check=False, **LIM)
        assert b.returncode != 0 and "cuMemMap" in b.stderr, b.stdout + b.stderr


def test_paid_bytes_written_into_an_importers_record_are_not_given_up(env: Env) -> None:
    """While the creator pays, the tenant writes "paid" into B's import record: B's
    release gives up nothing (only a record the creator's departure handed on counts)."""
    with procs(env, _creator(env, 16 * MiB, "hold")) as (a,):
        (pid, fd), = lines(a.until("ready"), "fd")
        b_script = ("init", "alloc", "mem", str(16 * MiB), "0", "vimport", str(pid), str(fd), str(16 * MiB), "0",
                    "vmap", "echo", "imported", "wait", "vunmap", "free", "info", "hold")
        with procs(env, b_script) as (b,):
            b.until("imported")
            (rec, words), = [(r, w) for r, w in enumerate(_records(env, b.p.pid)) if w[0] >> 56 == 2]
            _poke(env, b.p.pid, rec, (words[0], 16 * MiB, words[2]))
            b.go()
            assert free_of(b.until("holding")) == [16 * MiB]
            assert free_of(_check(env, "alloc", "mem", str(16 * MiB + 1), OOM).stdout) == [16 * MiB]


def test_paid_bytes_written_into_a_second_importers_record_are_not_given_up(env: Env) -> None:
    """The creator is killed, one of two importers pays; the tenant writes "paid" into
    the other one's record too: that one's release gives up nothing."""
    with procs(env, _creator(env, 16 * MiB, "hold")) as (a,):
        (pid, fd), = lines(a.until("ready"), "fd")
        imp = ("init", "alloc", "mem", str(8 * MiB), "0", "vimport", str(pid), str(fd), str(16 * MiB), "0",
               "vmap", "echo", "imported", "wait", "vunmap", "free", "info", "echo", "released", "hold")
        with procs(env, imp, imp) as (b, c):
            b.until("imported")
            c.until("imported")
            a.stop()
            assert free_of(_check(env).stdout) == [16 * MiB]  # 8 + 8 + 16 shared, paid by one of them
            recs = {p.p.pid: [(r, w) for r, w in enumerate(_records(env, p.p.pid)) if w[0] >> 56 == 2][0]
                    for p in (b, c)}
            (unpaid_pid, (rec, words)), = [(k, v) for k, v in recs.items() if v[1][1] == 0]
            _poke(env, unpaid_pid, rec, (words[0], 16 * MiB, words[2]))
            unpaid = b if b.p.pid == unpaid_pid else c
            unpaid.go()
            assert free_of(unpaid.until("released")) == [16 * MiB]
            assert free_of(_check(env, "alloc", "mem", str(16 * MiB + 1), OOM).stdout) == [16 * MiB]


# ----------------------------------------------------------------- ASan and valgrind
def _sanitized(env: Env, tool: str) -> tuple[str, ...]:
    if tool == "valgrind":
        if shutil.which("valgrind") is None:
            pytest.skip("no valgrind")
        return tuple(VALGRIND)
    build("asan")
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not libasan.startswith("/"):
        pytest.skip("libasan not available")
    env.build = BUILD / "asan"
    env.extra = {"LD_PRELOAD": f"{libasan}:{BUILD / 'asan' / 'libvgpu.so'}",
                 "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=23",
                 "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
    return ()


def _take_fd(pid: int, fd: int) -> int:
    """The creator's descriptor itself (one open file, as SCM_RIGHTS passes it), taken
    here with pidfd_getfd: valgrind does not know that system call, so the importer
    inherits it."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        got = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
    finally:
        os.close(pidfd)
    assert got >= 0, os.strerror(ctypes.get_errno())
    return int(got)


def _importer(fd: int) -> tuple[str, ...]:
    return ("init", "vimportfd", str(fd), str(16 * MiB), "0", "vmap", "echo", "imported", "wait",
            "info", "vunmap", "free", "info")


@pytest.mark.parametrize("tool", ["asan", "valgrind"])
def test_sharing_under_sanitizers(env: Env, tool: str) -> None:
    """The creator killed while imported, the creator exiting normally, the importer's
    hand-on and release, under ASan+UBSan or valgrind (every process of the run)."""
    pre = _sanitized(env, tool)
    with procs(env, _creator(env, 16 * MiB, "hold"), pre=pre) as (a,):
        (pid, fd), = lines(a.until("ready"), "fd")
        mine = _take_fd(pid, fd)
        with procs(env, _importer(mine), _importer(mine), pre=pre, fds=(mine,)) as (b, c):
            os.close(mine)
            b.until("imported")
            c.until("imported")
            a.stop()
            assert free_of(_check(env).stdout) == [32 * MiB]
            b.go()
            out_b = b.finish()
            c.go()
            out_c = c.finish()
    for out in (out_b, out_c):
        assert "ERROR: AddressSanitizer" not in out and "runtime error" not in out, out
    assert free_of(out_b) == [32 * MiB, 32 * MiB] and free_of(out_c) == [32 * MiB, LIMIT]
    with procs(env, _creator(env, 16 * MiB, "wait"), pre=pre) as (a,):
        (pid, fd), = lines(a.until("ready"), "fd")
        mine = _take_fd(pid, fd)
        with procs(env, _importer(mine), pre=pre, fds=(mine,)) as (b,):
            os.close(mine)
            b.until("imported")
            a.go()
            a.finish()
            b.go()
            assert free_of(b.finish()) == [32 * MiB, LIMIT]
