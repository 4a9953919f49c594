"""Cost of libvgpu on the stub driver.

Figures: ns added per cuMemAlloc/cuMemFree pair (0 and 10,000 live
allocations), ns added per cuLaunchKernel (no SM limit, and an SM limit of
50 % with tokens available, i.e. below the limit: forced on by the policy, or
following the monitor's utilization_switch read from the region or from the
read-only feedback file next to the library), private memory added per
process (all mappings except the shared region and the stub's state file).

Timing is paired inside one preloaded process (``bench_vgpu``): each round
times 2,000 calls through the interposed entry points and 2,000 straight into
the stub, so machine load hits both sides; a run reports the median per-round
difference over 31 rounds, and this script the median over ``--repeats`` runs.

``--baseline LIB`` also measures another build of ``libvgpu.so`` (e.g. one built from
the previous commit) in the same run, its runs interleaved with this build's, so
both see the same machine load; each figure is then printed for both.

usage: python bench/bench_libvgpu.py [--repeats N] [--baseline PATH/libvgpu.so]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native" / "libvgpu"
BUILD = NATIVE / "build"

#: Pseudo variable of a case: run a copy of the library with a feedback file next to it
#: saying "contended, not blocked" (what the device plugin mounts; limiter reads it at
#: every limited launch). Not passed to the process.
FEEDBACK = "BENCH_FEEDBACK_FILE"

CASES = {
    "alloc/free pair, 0 live": ("alloc_free_ns", 0, {}, 100.0),
    "alloc/free pair, 10,000 live": ("alloc_free_ns", 10000, {}, 150.0),
    "cuLaunchKernel, no SM limit": ("launch_ns", 0, {}, 30.0),
    "cuLaunchKernel, SM limit 50% (tokens left)": (
        "launch_ns", 0, {"CUDA_DEVICE_SM_LIMIT": "50", "GPU_CORE_UTILIZATION_POLICY": "force"}, 30.0),
    "cuLaunchKernel, SM 50%, switch from region": (
        "launch_ns", 0, {"CUDA_DEVICE_SM_LIMIT": "50"}, 30.0),
    "cuLaunchKernel, SM 50%, switch from feedback": (
        "launch_ns", 0, {"CUDA_DEVICE_SM_LIMIT": "50", FEEDBACK: "1"}, 30.0),
}


def run(live: int, preload: bool, tmp: Path, tag: str, lib: Path = BUILD / "libvgpu.so",
        **extra: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "VGPU_", "GPU_CORE", "LD_PRELOAD"))}
    env.update(LD_LIBRARY_PATH=str(BUILD / "stub"), VGPU_STUB_STATE=str(tmp / "stub.state"),
               CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp / f"region-{tag}.cache"),
               CUDA_DEVICE_MEMORY_LIMIT="64g", VGPU_STUB_MEM_MB="131072", LIBCUDA_LOG_LEVEL="1")
    if extra.pop(FEEDBACK, None):
        lib = with_feedback(lib, tmp, tag)
    env.update(extra)
    if preload:
        env["LD_PRELOAD"] = str(lib)
    out = subprocess.run([str(BUILD / "tests" / "bench_vgpu"), str(live), "31"], env=env, check=True,
                         capture_output=True, text=True).stdout
    return {k: float(v) for k, v in (ln.split() for ln in out.splitlines())}


def with_feedback(lib: Path, tmp: Path, tag: str) -> Path:
    """A copy of ``lib`` in a directory of its own, with the monitor's feedback file
    (switch 1, not blocked) next to it, as the device plugin mounts it."""
    from hami.deviceplugin import feedbackfile

    d = tmp / f"lib-{tag}"
    d.mkdir(exist_ok=True)
    copy = d / "libvgpu.so"
    shutil.copy(lib, copy)
    (d / feedbackfile.FEEDBACK_FILE).write_bytes(feedbackfile.encode(1, False))
    return copy


def main() -> None:
    ap = argparse.ArgumentParser(description="libvgpu overhead on the stub driver")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another libvgpu.so measured in the same run (interleaved)")
    args = ap.parse_args()
    if args.baseline is not None:
        compare(args.repeats, args.baseline)
        return
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
    print("libvgpu overhead on the stub driver (paired in-process timing, median of runs)")
    missed = 0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for i, (name, (key, live, extra, target)) in enumerate(CASES.items()):
            runs = [run(live, True, tmp, str(i), **extra) for _ in range(args.repeats)]
            added = statistics.median(r[key] for r in runs)
            direct = statistics.median(r[key.replace("_ns", "_direct_ns")] for r in runs)
            ok = added <= target
            missed += not ok
            print(f"  {name:44s} {added:7.1f} ns added (direct call {direct:6.1f} ns)  "
                  f"target <= {target:g}: {'ok' if ok else 'MISSED'}")
        for live in (0, 10000):
            base = run(live, False, tmp, "mem")["private_kb"]
            mine = run(live, True, tmp, f"mem{live}")["private_kb"]
            ok = mine - base <= 2048
            missed += not ok
            print(f"  {'private memory, ' + format(live, ',') + ' live':44s} {mine - base:7.0f} kB added "
                  f"(process without libvgpu {base:.0f} kB)  target <= 2048: {'ok' if ok else 'MISSED'}")
    print("all targets met" if not missed else f"{missed} target(s) missed")


def compare(repeats: int, baseline: Path) -> None:
    """Every figure for this build and ``baseline``, runs interleaved (A, B, A, B, ...)."""
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
    libs = {"this build": BUILD / "libvgpu.so", "baseline": baseline.resolve()}
    print(f"libvgpu overhead, this build vs {baseline} (same run, interleaved; median of {repeats})")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for i, (name, (key, live, extra, _target)) in enumerate(CASES.items()):
            got: dict[str, list[float]] = {k: [] for k in libs}
            for r in range(repeats):
                for k, lib in libs.items():
                    got[k].append(run(live, True, tmp, f"{i}-{k[0]}-{r}", lib, **extra)[key])
            print(f"  {name:44s} " + "  ".join(f"{k}: {statistics.median(v):6.1f} ns" for k, v in got.items()))
        for live in (0, 10000):
            base = run(live, False, tmp, "mem")["private_kb"]
            added = {k: run(live, True, tmp, f"mem{live}-{k[0]}", lib)["private_kb"] - base for k, lib in libs.items()}
            print(f"  {'private memory, ' + format(live, ',') + ' live':44s} "
                  + "  ".join(f"{k}: {v:6.0f} kB" for k, v in added.items()))


if __name__ == "__main__":
    main()
