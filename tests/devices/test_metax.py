"""MetaX (spec §9: whole GPUs from capacity; sGPU vmemory in GiB, vcore percent, QoS
policies, policy-neutral ScoreNode)."""

from __future__ import annotations

from typing import Any

import pytest

from hami.core.model import ContainerDeviceRequest
from hami.core.vendor import FitContext
from hami.devices.common import AdmissionError
from hami.devices.metax import QOS_POLICIES, MetaxSgpu
from hami.devices.shares import METAX_GPU, WholeCardVendor
from tests.devices.util import ctr, node, pod, state

S = MetaxSgpu()
G = WholeCardVendor(METAX_GPU)


@pytest.mark.parametrize(("limits", "want"), [
    ({"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 60, "metax-tech.com/vmemory": 4},
     ContainerDeviceRequest(1, "Metax-SGPU", 4096, 101, 60)),
    ({"metax-tech.com/sgpu": 1}, ContainerDeviceRequest(1, "Metax-SGPU", 0, 100, 0)),
    ({"metax-tech.com/gpu": 1}, None),
])
def test_sgpu_requests(limits: dict[str, int], want: ContainerDeviceRequest | None) -> None:
    assert S.container_request(ctr(limits)) == want
    assert S.resource_names().memory_unit_mib == 1024


@pytest.mark.parametrize("policy", QOS_POLICIES)
def test_qos_policies_accepted(policy: str) -> None:
    c = ctr({"metax-tech.com/sgpu": 1})
    p: dict[str, Any] = pod(c, annotations={"metax-tech.com/sgpu-qos-policy": policy})
    assert S.mutate_admission(c, p) is True


def test_bad_qos_policy() -> None:
    c = ctr({"metax-tech.com/sgpu": 1})
    with pytest.raises(AdmissionError, match="best-effort, fixed-share, burst-share"):
        S.mutate_admission(c, pod(c, annotations={"metax-tech.com/sgpu-qos-policy": "fast"}))


def test_sgpu_node_devices_and_fit() -> None:
    value = '[{"id":"mx-0","count":16,"devmem":65536,"devcore":100,"type":"C500","health":true}]'
    devs = S.node_devices(node(annotations={"metax-tech.com/node-gpu-devices": value}))
    out = S.fit(state(devs), ContainerDeviceRequest(1, "Metax-SGPU", 4096, 101, 60), FitContext())
    assert out.ok and out.devices[0].type == "Metax-SGPU"
    assert S.policy_neutral


def test_whole_gpu_from_capacity() -> None:
    devs = G.node_devices(node("mx", capacity={"metax-tech.com/gpu": 2}))
    assert [d.uuid for d in devs] == ["mx-metax-gpu-0", "mx-metax-gpu-1"]
    req = G.container_request(ctr({"metax-tech.com/gpu": 1}))
    assert req == ContainerDeviceRequest(1, "Metax-GPU", 0, 100, 100)
    out = G.fit(state(devs, {"mx-metax-gpu-1": (1, 0, 100)}), req, FitContext())
    assert [d.uuid for d in out.devices] == ["mx-metax-gpu-0"]
