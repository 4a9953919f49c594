"""Memory limits on every allocation path, frees, memory-info virtualisation, limit syntax."""

from __future__ import annotations

import pytest
from libvgpu_harness import Env, lines

pytestmark = pytest.mark.native

MiB = 1 << 20
LIMIT = 48 * MiB  # divisible by 3, 16 and 512: exact fits exist for every path
STUB_TOTAL = 16384 * MiB

# path -> smallest request above the limit that the path can express
PATHS = {
    "mem": LIMIT + 1,
    "managed": LIMIT + 1,
    "async": LIMIT + 1,
    "async_ptsz": LIMIT + 1,
    "pool": LIMIT + 1,
    "vmm": LIMIT + 1,
    "pitch": LIMIT + 512,
    "array": LIMIT + 4,
    "array3d": LIMIT + 16,
    "mipmap": LIMIT + 6,
}


@pytest.mark.parametrize("kind", sorted(PATHS))
def test_limit_exact_fit_and_one_over(env: Env, kind: str) -> None:
    p = env.run("init", "alloc", kind, str(PATHS[kind]), "2", "alloc", kind, str(LIMIT), "0", "info",
                "alloc", "mem", "1", "2", "free", "sync", "info", "alloc", kind, str(LIMIT), "0", "info",
                CUDA_DEVICE_MEMORY_LIMIT="48m")
    info = lines(p.stdout, "info")
    assert info[0][:2] == [0, LIMIT]  # full
    assert info[1][:2] == [LIMIT, LIMIT]  # the free returned everything
    assert info[2][:2] == [0, LIMIT]


def test_frees_are_exact_across_paths(env: Env) -> None:
    args = ["init"]
    for kind in sorted(PATHS):
        args += ["alloc", kind, str(3 * MiB), "0"]
    args += ["info", "freeall", "sync", "info"]  # a pool gives its memory back at synchronisation
    p = env.run(*args, CUDA_DEVICE_MEMORY_LIMIT="48m")
    info = lines(p.stdout, "info")
    assert info[0][0] == LIMIT - len(PATHS) * 3 * MiB
    assert info[1][0] == LIMIT


def test_memory_info_reports_the_slice(env: Env) -> None:
    p = env.run("init", "alloc", "mem", str(10 * MiB), "0", "info", "total", "0", "nvml", "0", "nvml", "1",
                CUDA_DEVICE_MEMORY_LIMIT="1Gi")
    assert lines(p.stdout, "info")[0][:2] == [1024 * MiB - 10 * MiB, 1024 * MiB]
    assert lines(p.stdout, "total")[0] == [0, 1024 * MiB]
    assert lines(p.stdout, "nvml")[0] == [0, 1024 * MiB, 10 * MiB, 1014 * MiB]
    assert lines(p.stdout, "nvml2")[0] == [0, 1024 * MiB, 10 * MiB, 1014 * MiB]
    assert lines(p.stdout, "nvml")[1] == [1, 1024 * MiB, 0, 1024 * MiB]


def test_per_device_limits(env: Env) -> None:
    p = env.run("init", "dev", "1", "alloc", "mem", str(16 * MiB + 1), "2", "alloc", "mem", str(16 * MiB), "0",
                "info", "dev", "0", "alloc", "mem", str(40 * MiB), "0", "info",
                CUDA_DEVICE_MEMORY_LIMIT="48m", CUDA_DEVICE_MEMORY_LIMIT_1="16Mi")
    info = lines(p.stdout, "info")
    assert info[0][:2] == [0, 16 * MiB]
    assert info[1][:2] == [8 * MiB, LIMIT]


@pytest.mark.parametrize(("value", "total"), [
    ("48m", LIMIT), ("48M", LIMIT), ("48Mi", LIMIT), ("50331648", LIMIT), ("0.046875g", LIMIT),
    ("49152k", LIMIT), ("49152Ki", LIMIT),
])
def test_limit_syntax(env: Env, value: str, total: int) -> None:
    p = env.run("init", "info", CUDA_DEVICE_MEMORY_LIMIT=value)
    assert lines(p.stdout, "info")[0][1] == total


@pytest.mark.parametrize("value", ["2gbx", "lots", "-5m", "1.5", "12q"])
def test_nonsense_limit_is_an_error_not_a_tiny_limit(env: Env, value: str) -> None:
    p = env.run("init", "info", "alloc", "mem", str(100 * MiB), "0", CUDA_DEVICE_MEMORY_LIMIT=value)
    assert "invalid CUDA_DEVICE_MEMORY_LIMIT" in p.stderr
    assert lines(p.stdout, "info")[0][1] == STUB_TOTAL  # no limit rather than 2 bytes


def test_parse_program(env: Env) -> None:
    p = env.run(prog="test_parse", preload=False)
    assert "parse tests ok" in p.stdout


def test_contexts_are_counted(env: Env) -> None:
    # the stub charges 8 MiB per context; host-PID detection measures it
    p = env.run("init", "info", "alloc", "ctx", "0", "0", "info", "free", "info",
                CUDA_DEVICE_MEMORY_LIMIT="48m", VGPU_STUB_CTX_MB="8")
    info = lines(p.stdout, "info")
    assert [i[0] for i in info] == [LIMIT - 8 * MiB, LIMIT - 16 * MiB, LIMIT - 8 * MiB]
    other = str(env.tmp / "small.cache")
    env.run("init", "alloc", "ctx", "0", "2", CUDA_DEVICE_MEMORY_LIMIT="12m", VGPU_STUB_CTX_MB="8",
            CUDA_DEVICE_MEMORY_SHARED_CACHE=other)


def test_b29_host_located_and_bad_device_vmm(env: Env) -> None:
    """B29: host-located cuMemCreate passes through uncounted; an invalid device id never indexes the table."""
    p = env.run("init", "alloc", "vmm_host", str(100 * MiB), "0", "alloc", "vmm_badid", str(MiB), "101", "info",
                "free", CUDA_DEVICE_MEMORY_LIMIT="48m")
    assert lines(p.stdout, "info")[0][:2] == [LIMIT, LIMIT]


def test_b30_vmm_counted_per_device(env: Env) -> None:
    """B30: cuMemCreate 16 GB on a device limited to 15000 MB fails cleanly; smaller ones are counted."""
    p = env.run("init", "dev", "1", "alloc", "vmm", str(16000 * MiB), "2", "alloc", "vmm", str(15000 * MiB), "0",
                "info", "alloc", "mem", "1", "2", "free", "info", "nvml", "1",
                CUDA_DEVICE_MEMORY_LIMIT_0="15000m", CUDA_DEVICE_MEMORY_LIMIT_1="15000m", VGPU_STUB_MEM_MB="24576")
    info = lines(p.stdout, "info")
    assert info[0][:2] == [0, 15000 * MiB]
    assert info[1][:2] == [15000 * MiB, 15000 * MiB]


def test_pool_allocations_charge_the_pools_device(env: Env) -> None:
    p = env.run("init", "alloc", "pool1", str(16 * MiB + 1), "2", "alloc", "pool1", str(16 * MiB), "0",
                "info", "nvml", "1", CUDA_DEVICE_MEMORY_LIMIT="48m", CUDA_DEVICE_MEMORY_LIMIT_1="16m")
    assert lines(p.stdout, "info")[0][0] == LIMIT  # device 0 (current) untouched
    assert lines(p.stdout, "nvml")[0] == [1, 16 * MiB, 16 * MiB, 0]


def test_b29_vmm_from_a_thread_without_context(env: Env) -> None:
    """B29 variant: no current context; the properties name device 1, which is charged."""
    p = env.run("init", "noctx", "alloc", "vmm1", str(16 * MiB + 1), "2", "alloc", "vmm1", str(16 * MiB), "0",
                "nvml", "1", "nvml", "0", CUDA_DEVICE_MEMORY_LIMIT="48m", CUDA_DEVICE_MEMORY_LIMIT_1="16m")
    nv = lines(p.stdout, "nvml")
    assert nv[0] == [1, 16 * MiB, 16 * MiB, 0] and nv[1] == [0, LIMIT, 0, LIMIT]
