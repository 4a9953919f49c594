"""Spread of the SM-limit figures the native tests assert on, idle and under CPU load.

Each round runs what the native SM-limit tests run (100-block launches on the stub at
10 us per block, i.e. 1 ms of simulated GPU time each):

* an unlimited process, ``rate 1.5 100`` (the old tests' baseline), and one running
  the tests' FREE script (1 s, then four 0.5 s windows);
* a process with ``CUDA_DEVICE_SM_LIMIT=30`` running the tests' STEADY script (2 s of
  convergence, then eight 0.5 s windows);
* two such processes of one container at once, started together at a barrier file.

and prints, per load, the distribution (min, 5th/50th/95th percentile, max) of

* ``old ratio``: the limited launch rate over the first 2 s after convergence divided
  by the baseline's, measured in a separate process (what the tests asserted before:
  within [0.20, 0.40], two processes' sum within [0.20, 0.45]);
* ``2 s mean busy``: the simulated GPU's busy percent as NVML reports it over those
  2 s (the limited process's own; for two processes, both together as each of them
  sees it);
* ``median busy``: the median of that over the eight 0.5 s windows (what the tests
  assert now: [20, 40] for one process, [15, 45] or [20, 45] elsewhere, over 75 for
  an unlimited process).

``--load N`` adds N busy-loop processes (one per core on a 2-core machine: 2) for three
more passes: loaded throughout, loaded during the baseline only, loaded during the
limited runs only (the load changing between two runs, as when other jobs start and
stop on a shared CI machine); they are killed when the script ends.

usage: python bench/spread_sm_limit.py [--rounds N] [--load N] [--no-flip]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "native" / "libvgpu" / "build"
BUSY = {"VGPU_STUB_NS_PER_BLOCK": "10000"}
# the tests' runs (tests/native/libvgpu_harness.py): convergence, then 0.5 s windows
STEADY = ("rate", "2", "100", *("rate", "0.5", "100") * 8)
FREE = ("rate", "1", "100", *("rate", "0.5", "100") * 4)


def _run(tmp: Path, cache: str, *args: str, **kv: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "VGPU_", "GPU_CORE"))}
    env.update(LD_LIBRARY_PATH=str(BUILD / "stub"), LD_PRELOAD=str(BUILD / "libvgpu.so"),
               VGPU_STUB_STATE=str(tmp / "stub.state"), CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp / cache),
               **BUSY, **kv)
    return subprocess.Popen([str(BUILD / "tests" / "vgtest"), *args], env=env, stdout=subprocess.PIPE, text=True)


def _rates(p: subprocess.Popen[str]) -> list[tuple[float, float, float]]:
    """(launches/s, own busy %, every process's busy %) of each ``rate`` segment."""
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    return [(float(f[1]), float(f[2]), float(f[3])) for f in (ln.split() for ln in out.splitlines())
            if f[:1] == ["rate"]]


class Load:
    """``n`` busy-loop processes, stopped (SIGSTOP) until ``on()``; ``close()`` kills them."""

    def __init__(self, n: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
        self.off()

    def on(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGCONT)

    def off(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGSTOP)

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def one_round(base_load: bool | None = None, load: Load | None = None) -> dict[str, float]:
    """One round's figures (see the module docstring). With ``load`` and ``base_load``
    not None, the load runs during the baseline only (True) or during the rest only."""
    def switch(on: bool) -> None:
        if load is not None and base_load is not None:
            (load.on if on else load.off)()

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        switch(bool(base_load))
        (base_rate, _, _), = _rates(_run(tmp, "base.cache", "init", "rate", "1.5", "100"))
        free = _rates(_run(tmp, "free.cache", "init", *FREE))
        switch(not base_load)
        lim = _rates(_run(tmp, "one.cache", "init", *STEADY, CUDA_DEVICE_SM_LIMIT="30"))
        go = tmp / "go"
        two = [_run(tmp, "two.cache", "init", "echo", "ready", "waitfile", str(go), *STEADY,
                    CUDA_DEVICE_SM_LIMIT="30") for _ in range(2)]
        for p in two:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        go.touch()
        both = [_rates(p) for p in two]
        switch(False)
    # the old tests' 2 s window after 2 s of convergence: the first four 0.5 s windows
    old = [sum(r[0] for r in run[1:5]) / 4 for run in both + [lim]]
    return {"old ratio, one process": old[-1] / base_rate,
            "old ratio, two processes": (old[0] + old[1]) / base_rate,
            "2 s mean busy %, one process": sum(r[1] for r in lim[1:5]) / 4,
            "median busy %, one process": statistics.median(r[1] for r in lim[1:]),
            "2 s mean busy %, two, max of both": max(sum(r[2] for r in run[1:5]) / 4 for run in both),
            "median busy %, two, max of both": max(statistics.median(r[2] for r in run[1:]) for run in both),
            "median busy %, two, min of both": min(statistics.median(r[2] for r in run[1:]) for run in both),
            "median busy %, unlimited": statistics.median(r[1] for r in free[1:])}


def report(title: str, rounds: list[dict[str, float]]) -> None:
    print(f"== {title}: {len(rounds)} rounds")
    for key in rounds[0]:
        xs = sorted(r[key] for r in rounds)
        q = statistics.quantiles(xs, n=20, method="inclusive") if len(xs) > 1 else xs * 19
        print(f"  {key:36s} min {xs[0]:7.3f}  p5 {q[0]:7.3f}  median {statistics.median(xs):7.3f}  "
              f"p95 {q[-1]:7.3f}  max {xs[-1]:7.3f}")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--load", type=int, default=2, help="busy-loop processes for the loaded pass (0: none)")
    ap.add_argument("--flip", action=argparse.BooleanOptionalAction, default=True,
                    help="also the passes loaded during the baseline only / the limited runs only")
    a = ap.parse_args()
    report("as the machine is", [one_round() for _ in range(a.rounds)])
    if a.load <= 0:
        return
    load = Load(a.load)
    try:
        load.on()
        report(f"with {a.load} busy-loop processes", [one_round() for _ in range(a.rounds)])
        load.off()
        if not a.flip:
            return
        report(f"{a.load} busy loops during the baseline only", [one_round(True, load) for _ in range(a.rounds)])
        report(f"{a.load} busy loops during the limited runs only", [one_round(False, load)
                                                                     for _ in range(a.rounds)])
    finally:
        load.close()


if __name__ == "__main__":
    main()
