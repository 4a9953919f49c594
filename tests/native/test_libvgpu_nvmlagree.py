"""NVML and CUDA agree inside the container (issue 26 §3 row).

vLLM and PyTorch read both ``cuMemGetInfo`` and NVML (``nvmlDeviceGetMemoryInfo`` v1/v2,
``nvmlDeviceGetComputeRunningProcesses`` v1/v3): the limit and the usage must be the same
in each, and the process list must sum to that usage. A process of another container on
the same card is neither listed nor counted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest
from libvgpu_harness import VALGRIND, Env, lines
from test_libvgpu_devices import asan_env  # noqa: F401  (fixture)

pytestmark = pytest.mark.native

MiB = 1 << 20
LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT_0": "48m", "CUDA_DEVICE_MEMORY_LIMIT_1": "16m"}


def _hold(env: Env, mib: int, **kv: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([str(env.build / "tests" / "vgtest"), "init", "alloc", "mem", str(mib * MiB), "0",
                          "echo", "held", "hold"], env=env.environ(**kv), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    for line in p.stdout:
        if line.strip() == "held":
            return p
    raise AssertionError(p.stderr.read() if p.stderr else "")


@pytest.fixture
def busy_card(env: Env) -> Iterator[list[subprocess.Popen[str]]]:
    """Two processes of this container hold 10 and 5 MiB of card 0; a process of another
    container (its own region) holds 7 MiB of the same card."""
    procs = []
    try:
        procs.append(_hold(env, 10, **LIMIT))
        procs.append(_hold(env, 5, **LIMIT))
        procs.append(_hold(env, 7, CUDA_DEVICE_MEMORY_LIMIT="1g",
                           CUDA_DEVICE_MEMORY_SHARED_CACHE=str(env.tmp / "other.cache")))
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _check(out: str, ours: list[int]) -> None:
    (info,) = lines(out, "info")
    assert info[:2] == [33 * MiB, 48 * MiB]  # cuMemGetInfo: used = 15 MiB of 48
    assert lines(out, "nvml")[0] == [0, 48 * MiB, 15 * MiB, 33 * MiB]
    assert lines(out, "nvml2")[0] == [0, 48 * MiB, 15 * MiB, 33 * MiB]
    (procs,) = lines(out, "procs")
    pids = [p[0] for p in lines(out, "proc")]
    assert procs[1:] == [len(ours) + 1, 15 * MiB], out  # ours and this process (0 bytes)
    assert set(ours) < set(pids)
    (procs3,) = lines(out, "procs3")
    assert procs3[1:] == [len(ours) + 1, 15 * MiB, len(ours) + 1]


def test_cuda_and_nvml_report_one_limit_and_usage(env: Env, busy_card: list[subprocess.Popen[str]]) -> None:
    out = env.run("init", "info", "nvml", "0", "procs", "0", **LIMIT).stdout
    _check(out, [busy_card[0].pid, busy_card[1].pid])
    assert busy_card[2].pid not in [p[0] for p in lines(out, "proc")]
    # card 1: nothing of ours, the list is empty and the memory info says so
    out = env.run("nvml", "1", "procs", "1", **LIMIT).stdout
    assert lines(out, "nvml")[0] == [1, 16 * MiB, 0, 16 * MiB]
    assert lines(out, "procs")[0] == [1, 0, 0]


def test_pynvml_sees_what_cuda_sees(env: Env, busy_card: list[subprocess.Popen[str]]) -> None:
    """pynvml (ctypes: dlopen + dlsym, as vLLM and PyTorch reach NVML) in the container."""
    pytest.importorskip("pynvml")
    code = ("import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); "
            "m = n.nvmlDeviceGetMemoryInfo(h); ps = n.nvmlDeviceGetComputeRunningProcesses(h); "
            "print(m.total, m.used, m.free, sum(p.usedGpuMemory for p in ps), *sorted(p.pid for p in ps))")
    e = env.environ(**LIMIT)
    p = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    vals = [int(x) for x in p.stdout.split()]
    assert vals[:4] == [48 * MiB, 15 * MiB, 33 * MiB, 15 * MiB], p.stdout
    assert vals[4:] == sorted([busy_card[0].pid, busy_card[1].pid])


def test_process_list_under_asan_and_valgrind(asan_env: Env, env: Env,  # noqa: F811
                                              busy_card: list[subprocess.Popen[str]]) -> None:
    ours = [busy_card[0].pid, busy_card[1].pid]
    e = Env(env.tmp, asan_env.build, dict(asan_env.extra))
    p = subprocess.run([str(e.build / "tests" / "vgtest"), "init", "info", "nvml", "0", "procs", "0"],
                       env=e.environ(**LIMIT), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "ERROR: AddressSanitizer" not in p.stderr and "runtime error" not in p.stderr, \
        p.stderr
    _check(p.stdout, ours)
    if shutil.which("valgrind") is None:
        return
    p = subprocess.run([*VALGRIND, str(env.build / "tests" / "vgtest"), "init", "info",
                        "nvml", "0", "procs", "0"], env=env.environ(**LIMIT), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    _check(p.stdout, ours)
