"""The process environment cannot lift a mounted limit (issue 26 §2).

The device plugin mounts ``limits.env`` read-only next to the library; a process's own
environment (which the pod's command can set, after the webhook looked) may lower the
limits it holds but never raise or remove them. One test per variable that could
loosen one: the memory limits (global, per device, zero, nonsense), the SM limits, the
utilisation policy, CUDA_OVERSUBSCRIBE, the region path and the device mask.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from libvgpu_harness import FREE, STEADY, Env, lines, steady_busy_percent
from test_libvgpu_failclosed import bare, container, plugin_limits, results

from hami.monitor import region as reg

pytestmark = pytest.mark.native

MiB = 1 << 20
LIMIT = 48 * MiB
BUSY = {"VGPU_STUB_NS_PER_BLOCK": "10000"}

MEMORY_ENVS: dict[str, dict[str, str]] = {
    "global_raised": {"CUDA_DEVICE_MEMORY_LIMIT": "1t"},
    "per_device_raised": {"CUDA_DEVICE_MEMORY_LIMIT_0": "96m", "CUDA_DEVICE_MEMORY_LIMIT_1": "96m"},
    "per_device_zero": {"CUDA_DEVICE_MEMORY_LIMIT_0": "0", "CUDA_DEVICE_MEMORY_LIMIT_1": "0"},
    "global_nonsense": {"CUDA_DEVICE_MEMORY_LIMIT": "lots"},
    "oversubscribe": {"CUDA_OVERSUBSCRIBE": "true", "CUDA_DEVICE_MEMORY_LIMIT": "1t"},
}


@pytest.mark.parametrize("name", sorted(MEMORY_ENVS))
def test_environment_cannot_lift_the_mounted_memory_limit(env: Env, name: str) -> None:
    lib = container(env, plugin_limits(env.tmp / "vgpu"))
    p = bare(env, lib, "init", "alloc", "mem", str(LIMIT + 1), "-1", "alloc", "mem", str(LIMIT), "-1", "info",
             "dev", "1", "alloc", "mem", str(LIMIT + 1), "-1", "alloc", "mem", str(LIMIT), "-1", "info",
             **MEMORY_ENVS[name])
    assert results(p) == [2, 0, 2, 0], p.stdout + p.stderr
    assert [i[:2] for i in lines(p.stdout, "info")] == [[0, LIMIT], [0, LIMIT]]


def test_device_mask_cannot_borrow_another_devices_limit(env: Env) -> None:
    """Per-device limits 48 and 16 MiB: a process that sees GPU 1 first gets 16 MiB there."""
    d = env.tmp / "vgpu"
    lib = container(env, plugin_limits(d).replace("CUDA_DEVICE_MEMORY_LIMIT_1=48m", "CUDA_DEVICE_MEMORY_LIMIT_1=16m"))
    p = bare(env, lib, "init", "alloc", "mem", str(16 * MiB + 1), "-1", "alloc", "mem", str(16 * MiB), "-1",
             "info", CUDA_VISIBLE_DEVICES="1,0", CUDA_DEVICE_MEMORY_LIMIT="1t")
    assert results(p) == [2, 0], p.stdout + p.stderr
    assert lines(p.stdout, "info")[0][:2] == [0, 16 * MiB]


def test_environment_cannot_move_the_accounting_to_its_own_region(env: Env) -> None:
    d = env.tmp / "vgpu"
    lib = container(env, plugin_limits(d))
    holder = subprocess.Popen([str(env.build / "tests" / "vgtest"), "init", "alloc", "mem", str(32 * MiB), "0",
                               "hold"], env=env.environ(LD_PRELOAD=str(lib / "libvgpu.so")),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and "holding" in holder.stdout.readline() + holder.stdout.readline()
        elsewhere = env.tmp / "own.cache"
        p = bare(env, lib, "init", "alloc", "mem", str(16 * MiB + 1), "-1", "alloc", "mem", str(16 * MiB), "-1",
                 CUDA_DEVICE_MEMORY_SHARED_CACHE=str(elsewhere))
        assert results(p) == [2, 0], p.stdout + p.stderr
        assert not elsewhere.exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("sm_env", [{"CUDA_DEVICE_SM_LIMIT": "100"}, {"CUDA_DEVICE_SM_LIMIT_0": "100"},
                                    {"CUDA_DEVICE_SM_LIMIT": "0"}, {"CUDA_DEVICE_SM_LIMIT": "much"}])
def test_environment_cannot_lift_the_mounted_sm_limit(env: Env, sm_env: dict[str, str]) -> None:
    d = env.tmp / "vgpu"
    lib = container(env, plugin_limits(d))
    p = bare(env, lib, "init", **sm_env)
    assert p.returncode == 0, p.stderr
    r = reg.parse_region((d / "c0ffee.cache").read_bytes())
    assert r.sm_limit_percent[:2] == (30, 30)


def _busy_percent(env: Env, lib: Path, script: tuple[str, ...] = STEADY, **kv: str) -> float:
    """The simulated GPU's busy percent a process of the container ``lib`` holds
    (test_libvgpu_compute.py: what an SM limit holds; an unlimited process is about
    99 % busy)."""
    p = bare(env, lib, "init", *script, **BUSY, **kv)
    assert p.returncode == 0, p.stderr
    return steady_busy_percent(p.stdout)


def test_policy_disable_in_the_environment_does_not_lift_the_sm_limit(env: Env) -> None:
    """Measured before the fix: 1.0x the unlimited launch rate (99 % busy) with
    GPU_CORE_UTILIZATION_POLICY=disable."""
    lib = container(env, plugin_limits(env.tmp / "vgpu"))
    busy = _busy_percent(env, lib, GPU_CORE_UTILIZATION_POLICY="disable", CUDA_DEVICE_SM_LIMIT="100")
    assert 15 <= busy <= 45, busy


def test_mounted_policy_disable_holds_and_force_may_tighten_it(env: Env) -> None:
    """The honest paths: the plugin wrote ``disable`` (operator's or webhook's choice): the
    limiter is off; a process may still force it on."""
    d = env.tmp / "vgpu"
    lib = container(env, plugin_limits(d) + "GPU_CORE_UTILIZATION_POLICY=disable\n")
    assert _busy_percent(env, lib, FREE) > 75
    forced = _busy_percent(env, lib, GPU_CORE_UTILIZATION_POLICY="force")
    assert 15 <= forced <= 45, forced
