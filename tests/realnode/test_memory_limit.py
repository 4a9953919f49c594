"""Memory slices enforced in real containers: webhook -> kube-scheduler + hami extender ->
the real kubelet's Allocate on hami's device plugin -> runc starts the container with the
injected env, mounts and /etc/ld.so.preload -> libvgpu on the stub driver."""

from __future__ import annotations

import time
from typing import Any

from hami.testing.gpubed import GpuBed, gpu_test_pod
from tests.realnode.conftest import run_pod

MiB = 1 << 20


def lines(log: str, tag: str) -> list[list[int]]:
    return [[int(x) for x in ln.split()[1:]] for ln in log.splitlines() if ln.split()[:1] == [tag]]


def test_memory_slice_at_the_limit_succeeds_one_byte_over_fails(bed: GpuBed, client: Any) -> None:
    t0 = time.monotonic()
    pod = run_pod(client, gpu_test_pod(
        "mem-512", f"vgtest init info nvml 0 alloc mem {512 * MiB} 0 alloc mem 1 2 info",
        memory_mib=512))
    elapsed = time.monotonic() - t0
    assert bed.node is not None
    log = bed.node.container_log("default", "mem-512", "c")
    assert pod.status.phase == "Succeeded", log
    info = lines(log, "info")
    assert info[0][:2] == [512 * MiB, 512 * MiB]  # cuMemGetInfo: free, total = the slice
    assert info[1][:2] == [0, 512 * MiB]  # full after exactly 512 MiB; one byte more was OOM
    (nvml,) = lines(log, "nvml")
    assert nvml[1] == 512 * MiB  # NVML total is the slice too
    print(f"pod create to Succeeded: {elapsed:.1f} s")
