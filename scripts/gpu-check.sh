#!/usr/bin/env bash
# On a real GPU (PyTorch installed): build libvgpu, then check under LD_PRELOAD
#   1. a 4 GiB limit: torch.cuda.mem_get_info reports it, allocation past it
#      raises OOM, allocation up to it succeeds;
#   2. nvidia-smi in the same environment shows the 4 GiB slice and the usage;
#   3. matmul throughput at SM limits 100 / 50 / 25 (GPU_CORE_UTILIZATION_POLICY=force).
# Takes about 2-3 minutes. Exit status 0 only when 1 and 2 hold.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s -C native/libvgpu build/libvgpu.so
LIB="$PWD/native/libvgpu/build/libvgpu.so"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PY="${PYTHON:-python3}"
nvidia-smi -L || true

echo "== 1+2: 4 GiB memory limit"
env LD_PRELOAD="$LIB" CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_MEMORY_SHARED_CACHE="$WORK/mem.cache" \
    LIBCUDA_LOG_LEVEL=1 "$PY" - <<'PYEOF'
import subprocess, sys
import torch
GiB = 1 << 30
free, total = torch.cuda.mem_get_info(0)
print(f"mem_get_info: free={free / GiB:.3f} GiB total={total / GiB:.3f} GiB")
ok = total == 4 * GiB
held = torch.empty(int(2.5 * GiB), dtype=torch.uint8, device="cuda")
try:
    torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    print("FAIL: 2 GiB more than the 4 GiB limit allowed (2.5 GiB held)")
    ok = False
except torch.cuda.OutOfMemoryError:
    print("ok: allocation past the limit raised OutOfMemoryError")
torch.cuda.empty_cache()
free2, _ = torch.cuda.mem_get_info(0)
print(f"after 2.5 GiB: free={free2 / GiB:.3f} GiB")
smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits",
                      "-i", "0"], capture_output=True, text=True)
print("nvidia-smi (same environment):", smi.stdout.strip(), smi.stderr.strip())
try:
    tot_mib, used_mib = (int(x) for x in smi.stdout.split(","))
    if tot_mib != 4096:
        print("FAIL: nvidia-smi total is not the 4096 MiB limit"); ok = False
    if not 2560 <= used_mib <= 4096:
        print("FAIL: nvidia-smi used does not show the container's usage"); ok = False
except ValueError:
    print("FAIL: cannot parse nvidia-smi output"); ok = False
del held
sys.exit(0 if ok else 1)
PYEOF

echo "== 3: matmul throughput at SM limits 100/50/25"
for sm in 100 50 25; do
    env LD_PRELOAD="$LIB" CUDA_DEVICE_SM_LIMIT=$sm GPU_CORE_UTILIZATION_POLICY=force LIBCUDA_LOG_LEVEL=1 \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$WORK/sm$sm.cache" "$PY" - "$sm" <<'PYEOF'
import sys, time
import torch
sm = sys.argv[1]
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
def loop(seconds):
    n, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        n += 10
    return n / (time.time() - t0)
loop(5)  # let the limiter converge
rate = loop(15)
print(f"SM limit {sm:>3}%: {rate:8.1f} matmul/s  {rate * 2 * 4096**3 / 1e12:7.1f} TFLOP/s")
PYEOF
done
