"""Startup of many libvgpu processes at once on one node (issue 26 item 4).

Starts ``--procs`` processes (default 300) across ``--containers`` containers
(default 10) on one stub-driver node, all released at the same instant, and
measures for each the wall time from ``execve`` to its first successful
``cuMemAlloc_v2`` (p50, p99, max) and its CPU time (user+sys).

Setup, as on a node: one stub-driver state file (the node's GPUs); per
container its own shared-region file (``CUDA_DEVICE_MEMORY_SHARED_CACHE`` in
its own cache dir) and its own memory limit (``CUDA_DEVICE_MEMORY_LIMIT``,
container c gets ``64 + 8c`` MiB). In each container every tenth process asks
for more than its container's limit (limit + 1 MiB): those, and only those,
must be refused with ``CUDA_ERROR_OUT_OF_MEMORY``; every other process asks for
1 MiB, which fits even if all of them hold it at once.

Each process is ``native/libvgpu/build/tests/startup_probe``: the launcher forks
every child first, each blocks on one pipe; closing the pipe releases them all;
each child then reads CLOCK_MONOTONIC, passes it in ``VGPU_BENCH_EXEC_NS`` and
execs the probe, which reports its times since exec and its CPU time at main's
start (loader + constructors), after cuInit + context, and after the first
allocation. The same run without ``LD_PRELOAD`` (stub driver only, no limits)
gives the stub's share; the difference is libvgpu's.

The machine's load average (1 min) is printed with each run: on a shared
machine the figures move with it.

usage: python bench/bench_startup.py [--procs 300] [--containers 10] [--repeats 3]
                                    [--retain-delay-ms MS] [--lib PATH/libvgpu.so] [--no-baseline]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native" / "libvgpu"
BUILD = NATIVE / "build"
MiB = 1 << 20
GOAL_P99_S = 1.0


@dataclass
class Proc:
    """One probe's result: rc of the allocation (None: no result line), times in ns."""

    container: int
    over_limit: bool
    rc: int | None
    exit_status: int
    t_main_ns: int = 0
    t_init_ns: int = 0
    t_alloc_ns: int = 0
    cpu_main_ns: int = 0
    cpu_init_ns: int = 0
    cpu_alloc_ns: int = 0
    rusage_cpu_ns: int = 0
    hostpid_missed: bool = False


def container_limit_mib(c: int) -> int:
    """Memory limit of container ``c`` in MiB."""
    return 64 + 8 * c


def launch(procs: int, containers: int, tmp: Path, preload: bool, retain_delay_ms: int,
           lib: Path = BUILD / "libvgpu.so") -> list[Proc]:
    """Start ``procs`` probes at once; returns one :class:`Proc` per process.

    ``retain_delay_ms``: how long the stub takes to create a primary context
    (``VGPU_STUB_RETAIN_DELAY_MS``; the process is listed by NVML meanwhile).
    """
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("CUDA_", "VGPU_", "GPU_CORE", "LD_PRELOAD", "LIBCUDA"))}
    base.update(LD_LIBRARY_PATH=str(BUILD / "stub"), VGPU_STUB_STATE=str(tmp / "node.state"),
                VGPU_STUB_MEM_MB="65536", LIBCUDA_LOG_LEVEL="2")
    if retain_delay_ms:
        base["VGPU_STUB_RETAIN_DELAY_MS"] = str(retain_delay_ms)
    probe = str(BUILD / "tests" / "startup_probe")
    rfd, wfd = os.pipe()
    kids: dict[int, tuple[int, bool, Path]] = {}
    for i in range(procs):
        c = i % containers
        over = (i // containers) % 10 == 9
        cdir = tmp / f"container-{c}"
        cdir.mkdir(exist_ok=True)
        env = dict(base, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(cdir / "vgpu.cache"),
                   CUDA_DEVICE_MEMORY_LIMIT=f"{container_limit_mib(c)}m")
        if preload:
            env["LD_PRELOAD"] = str(lib)
        nbytes = (container_limit_mib(c) + 1) * MiB if over else MiB
        out = tmp / f"out-{i}"
        pid = os.fork()
        if pid == 0:  # child: wait for the start signal, then exec
            try:
                os.close(wfd)
                fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.read(rfd, 1)
                env["VGPU_BENCH_EXEC_NS"] = str(time.monotonic_ns())
                os.execve(probe, [probe, str(nbytes)], env)
            finally:
                os._exit(127)
        kids[pid] = (c, over, out)
    os.close(rfd)
    os.close(wfd)  # release every child at once
    results: list[Proc] = []
    for _ in range(procs):
        pid, status, ru = os.wait4(-1, 0)
        c, over, out = kids[pid]
        p = Proc(c, over, None, os.waitstatus_to_exitcode(status),
                 rusage_cpu_ns=int((ru.ru_utime + ru.ru_stime) * 1e9))
        text = out.read_text(errors="replace")
        p.hostpid_missed = "host PID not found" in text or "host PID detection skipped" in text
        for ln in text.splitlines():
            f = ln.split()
            if f[:1] == ["probe"] and len(f) == 8:
                p.rc = int(f[1])
                (p.t_main_ns, p.t_init_ns, p.t_alloc_ns,
                 p.cpu_main_ns, p.cpu_init_ns, p.cpu_alloc_ns) = (int(x) for x in f[2:])
        results.append(p)
    return results


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs``, nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def report(tag: str, res: list[Proc], preload: bool, load1: float) -> tuple[float, int]:
    """Print one run's figures (``load1``: the 1-minute load average just before the
    run); returns (p99 seconds, wrongly refused or failed processes)."""
    ok = [p for p in res if p.rc is not None]
    t = [p.t_alloc_ns / 1e9 for p in ok]
    ms = 1e3
    bad = [p for p in res if p.rc is None or p.exit_status != 0]
    if preload:
        bad += [p for p in ok if p.exit_status == 0 and p.rc != (2 if p.over_limit else 0)]
    refused = sum(1 for p in ok if p.rc == 2)
    over = sum(1 for p in res if p.over_limit)
    p99 = pct(t, 0.99) if t else float("inf")
    mean = statistics.fmean
    print(f"  {tag:14s} load1 {load1:5.2f}  exec->first alloc p50 {pct(t, .5) * ms:7.1f} ms  "
          f"p99 {p99 * ms:7.1f} ms  max {max(t) * ms:7.1f} ms  (main p99 "
          f"{pct([p.t_main_ns / 1e9 for p in ok], .99) * ms:6.1f} ms, cuInit+ctx p99 "
          f"{pct([p.t_init_ns / 1e9 for p in ok], .99) * ms:6.1f} ms)")
    print(f"  {'':14s} CPU per process (user+sys, mean): total {mean(p.rusage_cpu_ns for p in res) / 1e6:6.2f} ms"
          f" = loader+ctors {mean(p.cpu_main_ns for p in ok) / 1e6:5.2f}"
          f" + cuInit/ctx {mean(p.cpu_init_ns - p.cpu_main_ns for p in ok) / 1e6:5.2f}"
          f" + first alloc {mean(p.cpu_alloc_ns - p.cpu_init_ns for p in ok) / 1e6:5.2f}"
          f" (+ exit); all processes {sum(p.rusage_cpu_ns for p in res) / 1e9:5.2f} s")
    print(f"  {'':14s} refused {refused} (over-limit processes {over}); wrong or failed: {len(bad)}; "
          f"host PID not found (no SM limiting): {sum(p.hostpid_missed for p in res)}")
    for p in bad[:5]:
        print(f"    container {p.container} over_limit={p.over_limit} rc={p.rc} exit={p.exit_status}")
    return p99, len(bad)


def main() -> None:
    ap = argparse.ArgumentParser(description="libvgpu startup of many processes at once on the stub driver")
    ap.add_argument("--procs", type=int, default=300)
    ap.add_argument("--containers", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-baseline", action="store_true", help="skip the stub-only runs")
    ap.add_argument("--lib", type=Path, default=BUILD / "libvgpu.so",
                    help="the libvgpu.so to measure (e.g. one built from an earlier commit)")
    ap.add_argument("--retain-delay-ms", type=int, default=0,
                    help="the stub's primary-context creation time (a real driver takes tens to hundreds of ms)")
    args = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
    print(f"{args.procs} processes, {args.containers} containers, one stub node, {os.cpu_count()} CPUs, "
          f"context creation {args.retain_delay_ms} ms")
    missed = 0
    for r in range(args.repeats):
        modes = [True] if args.no_baseline else [False, True]
        for preload in modes:
            load1 = os.getloadavg()[0]
            with tempfile.TemporaryDirectory(prefix="vgpu-startup-") as d:
                res = launch(args.procs, args.containers, Path(d), preload, args.retain_delay_ms,
                             args.lib.resolve())
            p99, bad = report(f"run {r + 1} " + ("libvgpu" if preload else "stub only"), res, preload, load1)
            if preload:
                missed += (p99 >= GOAL_P99_S) + (bad > 0)
    print(f"goal p99 < {GOAL_P99_S:g} s and only over-limit processes refused: "
          + ("met in every run" if not missed else f"missed {missed} time(s)"))


if __name__ == "__main__":
    main()
