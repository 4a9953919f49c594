"""MIG mode on the real node: the device plugin runs with ``operatingmode: mig`` over the
fake backend's MIG table; the real kubelet's Allocate hands the container exactly its MIG
instance (NVIDIA_VISIBLE_DEVICES = the instance's UUID, nothing else)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from hami.core.codec import decode_mig_allocations
from hami.testing.controlplane import wait_until
from hami.testing.gpubed import GpuBed, stub_uuid
from tests.node.test_mig_plugin import CONFIG, a100_entry
from tests.realnode.conftest import run_pod, running_bed

NODE = "mig-node-0"
GPU = stub_uuid(0)


@pytest.fixture(scope="module")
def bed() -> Iterator[GpuBed]:
    node_config = json.dumps({"nodeconfig": [{"name": NODE, "operatingmode": "mig"}]})
    with running_bed(node_name=NODE, inventory={"gpus": [a100_entry(GPU)]},
                     device_config=CONFIG, node_config=node_config) as b:
        yield b


def test_mig_instance_is_all_the_container_gets(bed: GpuBed, client: Any) -> None:
    from hami.deviceplugin.migfake import fake_mig_uuid
    from hami.testing.gpubed import gpu_test_pod

    pod = run_pod(client, gpu_test_pod("mig", "env | grep -E '^(NVIDIA|CUDA)_' | sort",
                                       memory_mib=9000, node=NODE))
    assert bed.node is not None
    log = bed.node.container_log("default", "mig", "c")
    assert pod.status.phase == "Succeeded", log
    (alloc,) = decode_mig_allocations(pod.metadata.annotations["hami.io/vgpu-mig-allocations"])
    assert alloc.profile == "2g.10gb"  # the smallest allowed profile holding 9000 MiB
    env = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
    assert env["NVIDIA_VISIBLE_DEVICES"] == alloc.runtime.mig_uuid == fake_mig_uuid(
        GPU, alloc.runtime.gpu_instance_id, alloc.runtime.compute_instance_id)
    assert GPU not in log  # the whole card is not named anywhere in the container's env
    client.delete(Pod, "mig", grace_period=0)
    wait_until(lambda: not list(client.list(Pod)), timeout_s=30, what="mig pod gone")
