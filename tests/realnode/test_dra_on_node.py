"""DRA mode on the real node: a ResourceClaim pod gets its GPU slice through CDI.

The chain: the webhook's translation (``hami.dra.translate``: ``nvidia.com/gpumem`` into a
ResourceClaimTemplate) -> kube-controller-manager's resourceclaim controller (the pod's
claim) -> kube-scheduler allocating it from the node's ResourceSlice -> the real kubelet's
NodePrepareResources on ``hami dra-plugin``, which writes the claim's CDI spec into the
node's CDI directory -> containerd 2.x injecting the spec's env and mounts into the
container -> libvgpu on the stub driver enforcing the limit. The pod asks for no
``nvidia.com/gpu``, so the device plugin takes no part: the limit can only come from CDI.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import codecs
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim

from hami.devices.nvidia import NvidiaConfig
from hami.dra.translate import translate
from hami.testing.controlplane import BinariesMissing, wait_until
from hami.testing.dranode import start_dra
from hami.testing.gpubed import GpuBed, gpu_test_pod
from tests.realnode.conftest import running_bed, skip_or_fail
from tests.realnode.test_feedbackfile import INITIAL, PROBE, probed
from tests.realnode.test_limits import SHOW_ENV, env_of, lines, log_of

MiB = 1 << 20


@pytest.fixture(scope="module")
def bed() -> Iterator[GpuBed]:
    with running_bed() as b:
        try:
            start_dra(b)
        except BinariesMissing as err:
            skip_or_fail(str(err))
        yield b


def cdi_specs(bed: GpuBed) -> set[str]:
    assert bed.node is not None
    return {p.name for p in bed.node.cdi_dir.glob("*.json")}


def test_claim_pod_gets_its_memory_slice_through_cdi(bed: GpuBed, client: Any) -> None:
    # the container stays up after vgtest: the kubelet unprepares the claim (the spec
    # file goes) before it reports the pod finished
    manifest = gpu_test_pod(
        "dra-512", f"{SHOW_ENV}; {PROBE}; vgtest init info alloc mem {512 * MiB} 0 alloc mem 1 2 info"
        "; echo vgtest-done; exec sleep 600", memory_mib=512)
    tr = translate(manifest, NvidiaConfig())
    assert tr is not None and tr.pod["spec"]["resourceClaims"]
    assert "nvidia.com/" not in json.dumps(tr.pod["spec"]["containers"][0]["resources"])
    for template in tr.templates.values():
        client.create(codecs.from_dict(template), namespace="default")
    client.create(codecs.from_dict(tr.pod))
    wait_until(lambda: "vgtest-done" in log_of(bed, "dra-512"), timeout_s=90,
               what="vgtest in the DRA pod finished")
    log = log_of(bed, "dra-512")
    assert env_of(log).get("CUDA_DEVICE_MEMORY_LIMIT_0") == "512m", log  # from the CDI spec
    info = lines(log, "info")
    assert info[0][:2] == [512 * MiB, 512 * MiB], log  # cuMemGetInfo: free, total = the slice
    assert info[1][:2] == [0, 512 * MiB], log  # full after exactly 512 MiB; 1 byte more: OOM
    # the claim's feedback file: the plugin's, read-only in the container
    assert probed(log) == (["write refused", "rm refused", "mv refused"], [INITIAL]), log

    pod = client.get(Pod, "dra-512", namespace="default")
    (status,) = pod.status.resourceClaimStatuses
    claim = client.get(ResourceClaim, status.resourceClaimName, namespace="default")
    (result,) = claim.status.allocation.devices.results
    assert result.pool == bed.node_name and result.driver == "gpu.hami.io"
    assert bed.node is not None
    spec_file = bed.node.cdi_dir / f"gpu.hami.io-{claim.metadata.uid}.json"
    spec = json.loads(spec_file.read_text())  # written at NodePrepareResources
    assert spec["devices"][0]["name"] == claim.metadata.uid
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=512m" in spec["devices"][0]["containerEdits"]["env"]

    client.delete(Pod, "dra-512", grace_period=0)  # NodeUnprepareResources removes it
    wait_until(lambda: spec_file.name not in cdi_specs(bed), timeout_s=60,
               what=f"{spec_file.name} removed from the node's CDI directory")
