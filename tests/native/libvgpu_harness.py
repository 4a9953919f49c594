"""Harness for the libvgpu tests: a fresh "container" (region file + stub state) per test."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native" / "libvgpu"
BUILD = NATIVE / "build"
#: How the tests run a program under valgrind: errors fail the run (exit 9); no gdbserver,
#: whose FIFOs (vgdb-pipe-*) would stay in /tmp for every process killed or forked.
VALGRIND = ["valgrind", "-q", "--vgdb=no", "--error-exitcode=9"]

MiB = 1 << 20
#: The memory limit of the tests' one-card container (``LIM`` in its environment).
LIMIT = 48 * MiB
LIM = {"CUDA_DEVICE_MEMORY_LIMIT": "48m"}
#: vgtest's expected-result argument for CUDA_ERROR_OUT_OF_MEMORY (the CUDA error code 2).
OOM = "2"


def build(target: str | None = None) -> None:
    """``make -C native/libvgpu [target]``; skips the calling test when there is no C toolchain."""
    import pytest

    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("no C toolchain")
    cmd = ["make", "-s", "-C", str(NATIVE)]
    if target:
        cmd.append(target)
    subprocess.run(cmd, check=True, capture_output=True)


@dataclass
class Env:
    """A fresh container: its own region file and stub-driver state."""

    tmp: Path
    build: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def region_path(self) -> Path:
        return self.tmp / "vgpu.cache"

    def environ(self, preload: bool = True, **kv: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "VGPU_", "GPU_CORE", "LIBCUDA"))}
        env.update(
            LD_LIBRARY_PATH=str(self.build / "stub"),
            CUDA_DEVICE_MEMORY_SHARED_CACHE=str(self.region_path),
            VGPU_STUB_STATE=str(self.tmp / "stub.state"),
        )
        if preload:
            env["LD_PRELOAD"] = str(self.build / "libvgpu.so")
        env.update(self.extra)
        env.update(kv)
        return env

    def run(self, *args: str, prog: str = "vgtest", check: bool = True, preload: bool = True,
            timeout: float = 60, **kv: str) -> subprocess.CompletedProcess[str]:
        """Run ``build/tests/<prog> args...`` in a process group of its own.

        On ``timeout`` (seconds) the whole group is killed, so a hung forked child
        is not left behind, and ``subprocess.TimeoutExpired`` is raised; with
        ``check`` a non-zero exit raises ``AssertionError`` with both outputs.
        """
        p = run_group([str(self.build / "tests" / prog), *args], self.environ(preload, **kv), timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{prog} {' '.join(args)} failed rc={p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def popen(self, *args: str, **kv: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(self.build / "tests" / "vgtest"), *args], env=self.environ(True, **kv),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_group(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True)`` in a new session; on
    ``timeout`` (seconds) SIGKILL goes to the whole process group (the command and
    every child it forked that did not leave the group), then the output read so far
    is attached to the ``subprocess.TimeoutExpired`` raised."""
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            kill_group(p.pid)
            out, err = p.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, out, err) from e
        finally:
            if p.returncode is None:  # interrupted: leave nothing running
                kill_group(p.pid)
                p.wait()
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def kill_group(pgid: int) -> None:
    """SIGKILL every process of group ``pgid``; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def lines(out: str, tag: str) -> list[list[int]]:
    """Numeric fields of every stdout line starting with ``tag``."""
    return [[int(x) for x in ln.split()[1:]] for ln in out.splitlines() if ln.split()[:1] == [tag]]


def free_of(out: str) -> list[int]:
    """The free bytes of every ``info`` line (``info <free> <total> ...``: cuMemGetInfo
    through libvgpu)."""
    return [i[0] for i in lines(out, "info")]


def phys_of(out: str) -> list[int]:
    """The bytes of every ``phys <device> <bytes>`` line: what the stub's device really
    holds."""
    return [i[1] for i in lines(out, "phys")]


def until(p: subprocess.Popen[str], word: str) -> str:
    """Read ``p``'s stdout up to and including the line that is ``word``; returns what
    was read. Raises ``AssertionError`` with stdout and stderr when stdout ends first."""
    out = []
    assert p.stdout is not None
    for line in p.stdout:
        out.append(line)
        if line.strip() == word:
            return "".join(out)
    raise AssertionError("".join(out) + (p.stderr.read() if p.stderr else ""))
@dataclass(frozen=True)
class Rate:
    """One ``rate SECS GRID`` segment of vgtest: launches per second; the simulated
    GPU's busy time of the process over those seconds in percent (its SM utilisation as
    the stub's NVML reports it, the quantity an SM limit holds); the same summed over
    every process of the stub's state (all_busy_percent). Both -1 when NVML did not
    list the process."""

    launches_per_s: float
    busy_percent: float
    all_busy_percent: float


def rates(out: str) -> list[Rate]:
    """The ``rate LAUNCHES_PER_S BUSY_PERCENT ALL_BUSY_PERCENT`` lines of vgtest's
    stdout ``out``, in order."""
    return [Rate(*map(float, f[1:4])) for f in (ln.split() for ln in out.splitlines()) if f[:1] == ["rate"]]


#: vgtest commands of a run under an SM limit: 2 s for the limiter to converge, then
#: eight 0.5 s windows (see steady_busy_percent)
STEADY = ("rate", "2", "100", *("rate", "0.5", "100") * 8)
#: the same for a run expected to run free: 1 s (a limiter wrongly on is down near its
#: limit by then), then four 0.5 s windows
FREE = ("rate", "1", "100", *("rate", "0.5", "100") * 4)


def steady_busy_percent(out: str, all_processes: bool = False) -> float:
    """The busy percent a process held after its first ``rate`` segment (the limiter's
    convergence): the median over the later segments of vgtest's stdout ``out`` (of
    STEADY or FREE), its own or (``all_processes``) every process's.

    The median, not the mean: the limiter's controller answers a step in what a launch
    costs (on the stub, a launch also counts the time its thread waits for a CPU after
    the simulated kernel, which jumps when the machine's load does) with a transient of
    a few 100 ms periods over the limit, which is its design; the held level is what the
    limit sets. Raises AssertionError when a segment is missing or NVML did not list
    the process."""
    segs = rates(out)[1:]
    assert len(segs) >= 4, out
    busy = [r.all_busy_percent if all_processes else r.busy_percent for r in segs]
    assert min(busy) >= 0, out
    return statistics.median(busy)
