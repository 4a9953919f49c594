"""SM limiter on the stub: launch-rate cut, utilisation policy, priority block via recent_kernel.

The stub driver keeps the simulated GPU busy for 10 us per grid block of a
launch (sleeping, so host CPU load barely matters) and reports that busy time
as the process's SM utilisation through NVML; a loop of 100-block launches
saturates it. Tolerance of the rate test: with a 30 % limit, the launch rate
measured after a 2 s convergence window divided by the unlimited rate must lie
in [0.20, 0.40].
"""

from __future__ import annotations

import mmap
import time

import pytest
from libvgpu_harness import Env, rates

from hami.monitor import region as reg

pytestmark = pytest.mark.native

BUSY = {"VGPU_STUB_NS_PER_BLOCK": "10000"}


def _baseline(env: Env) -> float:
    p = env.run("init", "rate", "1.5", "100", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(env.tmp / "base.cache"), **BUSY)
    rate = rates(p.stdout)[0]
    assert rate > 400  # sanity: about 1 ms per launch
    return rate


def _set(env: Env, field: str, value: int) -> None:
    with open(env.region_path, "r+b") as f, mmap.mmap(f.fileno(), reg.V1_SIZE) as m:
        reg.write_int32(m, field, value)


def test_sm_limit_30_cuts_launch_rate(env: Env) -> None:
    base = _baseline(env)
    p = env.run("init", "rate", "2", "100", "rate", "2", "100", CUDA_DEVICE_SM_LIMIT="30", **BUSY)
    limited = rates(p.stdout)[1]
    assert 0.20 <= limited / base <= 0.40, (limited, base)
    r = reg.parse_region(env.region_path.read_bytes())
    assert r.last_kernel_time > 0 and r.recent_kernel == 2


def test_policy_default_follows_switch_force_overrides_disable_ignores(env: Env) -> None:
    base = _baseline(env)
    env.run("init", CUDA_DEVICE_SM_LIMIT="30")  # create the region
    _set(env, "utilization_switch", 0)  # monitor: uncontended
    p = env.run("init", "rate", "2", "100", **BUSY)
    assert rates(p.stdout)[0] / base > 0.75
    p = env.run("init", "rate", "1.5", "100", "rate", "1.5", "100", GPU_CORE_UTILIZATION_POLICY="force", **BUSY)
    assert rates(p.stdout)[1] / base < 0.45
    _set(env, "utilization_switch", 1)
    p = env.run("init", "rate", "2", "100", GPU_CORE_UTILIZATION_POLICY="DISABLE", **BUSY)
    assert rates(p.stdout)[0] / base > 0.75


def test_recent_kernel_minus_one_blocks_until_cleared(env: Env) -> None:
    env.run("init", CUDA_DEVICE_SM_LIMIT="50")
    _set(env, "recent_kernel", -1)
    p = env.popen("init", "echo", "ready", "launch", "3", "1", "echo", "done")
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        assert p.poll() is None  # still blocked in the first launch
        _set(env, "recent_kernel", 0)
        out, _ = p.communicate(timeout=10)
        assert "launched 3" in out and "done" in out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    r = reg.parse_region(env.region_path.read_bytes())
    assert r.recent_kernel == 2


def test_two_processes_share_one_sm_limit(env: Env) -> None:
    """Both processes of a container see the container's summed utilisation: together they get ~30 %."""
    base = _baseline(env)
    env.run("init", CUDA_DEVICE_SM_LIMIT="30")
    procs = [env.popen("init", "rate", "2", "100", "rate", "2", "100", **BUSY) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    total = sum(rates(o)[1] for o in outs)
    assert 0.20 <= total / base <= 0.45, (total, base)
