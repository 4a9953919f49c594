"""The monitor reading cache files written by the C library itself (libvgpu under the stub
driver): limits, usage, UUIDs and feedback writes the library then observes."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami.deviceplugin.allocate import ContainerView, PodView
from hami.monitor.command import feedback_tick
from hami.monitor.lister import ContainerLister
from hami.monitor.metrics import MonitorCollector
from tests.node.regionfile import allocated

pytestmark = pytest.mark.native

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native" / "libvgpu"
BUILD = NATIVE / "build"
MiB = 2**20
STUB_UUID0 = "GPU-5a1e0000-0000-4000-8000-000000000000"
STUB_UUID1 = "GPU-5a1e0000-0000-4000-8000-000000000001"


@pytest.fixture(scope="module")
def built() -> Path:
    if not (NATIVE / "Makefile").exists():
        pytest.skip("native/libvgpu not present")
    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("no C toolchain")
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True, capture_output=True)
    return BUILD


@pytest.fixture
def container(built: Path, tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    root = tmp_path / "containers"
    d = root / "uid1_main"
    d.mkdir(parents=True)
    (d / "libvgpu.so").touch()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_", "VGPU_", "GPU_CORE", "LIBCUDA"))}
    env.update(LD_LIBRARY_PATH=str(built / "stub"), LD_PRELOAD=str(built / "libvgpu.so"),
               CUDA_DEVICE_MEMORY_SHARED_CACHE=str(d / "4b1d.cache"),
               VGPU_STUB_STATE=str(tmp_path / "stub.state"),
               CUDA_DEVICE_MEMORY_LIMIT_0="48m", CUDA_DEVICE_MEMORY_LIMIT_1="32m",
               CUDA_DEVICE_SM_LIMIT="50", CUDA_TASK_PRIORITY="0")
    proc = subprocess.Popen([str(built / "tests" / "vgtest"), "init", "alloc", "mem",
                             str(10 * MiB), "0", "dev", "1", "alloc", "mem", str(3 * MiB), "0",
                             "launch", "3", "1", "hold"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    for line in proc.stdout:
        if line.startswith("holding") or time.monotonic() > deadline:
            break
    try:
        yield root, proc
    finally:
        proc.kill()
        proc.wait()


def test_c_written_region_metrics_and_feedback(container: tuple[Path, subprocess.Popen[str]]) -> None:
    root, _proc = container
    lister = ContainerLister(root)
    lister.update({"uid1"})
    assert set(lister.containers) == {"uid1_main"}
    cf = lister.containers["uid1_main"]
    assert cf.path.stat().st_size == 2_008_953 and cf.version == 1
    region = cf.read()
    assert region.version == (1, 2)
    assert region.uuids[:2] == (STUB_UUID0, STUB_UUID1)
    assert region.limit_bytes[:2] == (48 * MiB, 32 * MiB)
    assert region.sm_limit_percent[:2] == (50, 50)
    assert region.priority == 0
    pod = PodView("ns", "p", "uid1", "node-a", "Running", allocated((STUB_UUID0, STUB_UUID1)),
                  (ContainerView("main", {"CUDA_TASK_PRIORITY": "0"}),))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(MonitorCollector("node-a", lister, lambda: [pod]))
    samples = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            samples.setdefault(s.name, {})[s.labels.get("vdevice_index")] = (s.labels, s.value)
    assert samples["hami_vgpu_memory_limit_bytes"]["0"][1] == 48 * MiB
    assert samples["hami_vgpu_memory_limit_bytes"]["1"][1] == 32 * MiB
    assert samples["hami_vgpu_memory_buffer_bytes"]["0"][1] == 10 * MiB
    assert samples["hami_vgpu_memory_buffer_bytes"]["1"][1] == 3 * MiB
    ctx0 = samples["hami_vgpu_memory_context_bytes"]["0"][1]
    assert samples["hami_vgpu_memory_used_bytes"]["0"][1] == 10 * MiB + ctx0
    labels = samples["hami_vgpu_memory_used_bytes"]["0"][0]
    assert labels["device_uuid"] == STUB_UUID0[:40] and labels["pod"] == "p"
    assert samples["hami_container_last_kernel_elapsed_seconds"]["0"][1] >= 0
    # feedback: alone on its GPUs -> utilization_switch 0 (the library created it as 1)
    assert region.utilization_switch == 1
    feedback_tick(lister, [pod])
    after = cf.read()
    assert after.utilization_switch == 0
    assert after.recent_kernel == max(region.recent_kernel - 1, 0)
    lister.close()
