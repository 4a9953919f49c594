"""Cost of libvgpu on the stub driver: ns added per cuMemAlloc/cuMemFree pair
(with 0 and 10,000 live allocations), ns added per cuLaunchKernel (no SM
limit, and an SM limit with tokens available), and private memory added per
process (all mappings except the shared region and the stub's state file).

Each figure is the median over REPEATS interleaved runs of (preloaded - direct),
each run itself reporting the median of 31 batches of 2,000 calls.

usage: python bench/bench_libvgpu.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native" / "libvgpu"
BUILD = NATIVE / "build"

TARGETS = {"alloc_free_ns@0": 100.0, "alloc_free_ns@10000": 150.0, "launch_ns@0": 30.0, "private_kb@0": 2048.0}


def run(live: int, preload: bool, tmp: Path, **extra: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "VGPU_", "GPU_CORE"))}
    env.update(LD_LIBRARY_PATH=str(BUILD / "stub"), VGPU_STUB_STATE=str(tmp / "stub.state"),
               CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp / f"region{len(extra)}.cache"),
               CUDA_DEVICE_MEMORY_LIMIT="64g", VGPU_STUB_MEM_MB="131072")
    env.update(extra)
    if preload:
        env["LD_PRELOAD"] = str(BUILD / "libvgpu.so")
    out = subprocess.run([str(BUILD / "tests" / "bench_vgpu"), str(live), "31"], env=env, check=True,
                         capture_output=True, text=True).stdout
    return {k: float(v) for k, v in (ln.split() for ln in out.splitlines())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
    results: dict[str, float] = {}
    base: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cases = [("", 0, {}), ("", 10000, {}),
                 ("sm50", 0, {"CUDA_DEVICE_SM_LIMIT": "50", "GPU_CORE_UTILIZATION_POLICY": "force"})]
        for tag, live, extra in cases:
            deltas: dict[str, list[float]] = {}
            for _ in range(args.repeats):
                direct = run(live, False, tmp)
                hooked = run(live, True, tmp, **extra)
                for k in direct:
                    deltas.setdefault(k, []).append(hooked[k] - direct[k])
                    base.setdefault(f"{k}@{live}", direct[k])
            for k, v in deltas.items():
                results[f"{k}@{live}{'/' + tag if tag else ''}"] = statistics.median(v)
    print("libvgpu overhead on the stub driver (median of interleaved runs, preloaded - direct)")
    for k, v in results.items():
        if k.startswith("private") and "sm50" in k:
            continue
        target = TARGETS.get(k)
        unit = "kB" if k.startswith("private") else "ns"
        ok = "ok" if target is not None and v <= target else "MISSED"
        verdict = "" if target is None else f"  (target <= {target:g}: {ok})"
        print(f"  {k:28s} {v:8.1f} {unit} added  [direct: {base.get(k.split('/')[0], float('nan')):.1f}]{verdict}")


if __name__ == "__main__":
    main()
