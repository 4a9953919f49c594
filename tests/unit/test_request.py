"""Container requests from pod specs (spec §1.3)."""

from __future__ import annotations

import pytest

from hami.core.model import PERCENT_UNSET, ContainerDeviceRequest
from hami.core.request import RequestError, pod_request
from hami.devices.nvidia import NvidiaConfig, container_request
from hami.devices.registry import build_registry, nvidia_registry
from tests.builders import container, pod

R = ContainerDeviceRequest


@pytest.mark.parametrize(("limits", "expected"), [
    ({"gpu": 1}, R(1, "NVIDIA", 0, 100, 0)),
    ({"gpu": 2, "gpumem": 4096}, R(2, "NVIDIA", 4096, PERCENT_UNSET, 0)),
    ({"gpu": 1, "gpumem_percentage": 0}, R(1, "NVIDIA", 0, 100, 0)),
    ({"gpu": 1, "gpumem_percentage": 40}, R(1, "NVIDIA", 0, 40, 0)),
    ({"gpu": 1, "gpumem_percentage": 150}, R(1, "NVIDIA", 0, 100, 0)),
    ({"gpu": 1, "gpucores": 30}, R(1, "NVIDIA", 0, 100, 30)),
    ({"gpu": "1", "gpumem": "3000"}, R(1, "NVIDIA", 3000, PERCENT_UNSET, 0)),
    ({"gpu": 1, "gpumem": 1000, "gpumem_percentage": 20}, R(1, "NVIDIA", 1000, 20, 0)),
    ({}, None),
    ({"gpu": 0}, None),
    ({"gpumem": 1000}, None),
])
def test_container_request_table(limits, expected):
    assert container_request(container(**limits), NvidiaConfig()) == expected


def test_defaults_and_memory_factor():
    config = NvidiaConfig(default_memory_mib=2048, default_cores_percent=10, memory_factor=4)
    assert container_request(container(gpu=1), config) == R(1, "NVIDIA", 2048, PERCENT_UNSET, 10)
    assert container_request(container(gpu=1, gpumem=100), config).memory_mib == 400


def test_renamed_resources():
    config = NvidiaConfig(resource_count_name="hami.io/gpu",
                          resource_memory_percentage_name="hami.io/gpumem-percentage")
    c = {"name": "a", "resources": {"limits": {"hami.io/gpu": 1, "hami.io/gpumem-percentage": 40}}}
    assert container_request(c, config) == R(1, "NVIDIA", 0, 40, 0)
    assert container_request(container(gpu=1), config) is None


def test_requests_fallback_when_no_limits():
    c = {"name": "a", "resources": {"requests": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 512}}}
    assert container_request(c, NvidiaConfig()) == R(1, "NVIDIA", 512, PERCENT_UNSET, 0)


@pytest.mark.parametrize("limits", [
    {"gpu": 1, "gpumem": "16Gi"},
    {"gpu": 1, "gpumem": -5},
    {"gpu": 1, "gpumem": 2**31},
    {"gpu": "1.5"},
    {"gpu": -1},
    {"gpu": 1, "gpucores": -3},
    {"gpu": "lots"},
])
def test_malformed_values_are_errors_not_empty_requests(limits):
    with pytest.raises(RequestError) as err:
        container_request(container(name="trainer", **limits), NvidiaConfig())
    assert "trainer" in str(err.value)


def test_pod_request_orders_init_first_and_sums_cpu():
    p = pod(containers=[container("a", gpu=1, requests={"cpu": "500m", "memory": "1Gi"}),
                        container("b", requests={"cpu": "1", "memory": "512Mi"})],
            init=[container("i", gpu=1, gpumem=100, requests={"cpu": "2"})])
    req = pod_request(p, nvidia_registry())
    assert req.n_init == 1
    assert req.containers[0] == R(1, "NVIDIA", 100, PERCENT_UNSET, 0)
    assert req.containers[2] is None
    assert (req.cpu_milli, req.memory_mib) == (2000, 1536)
    assert req.wants_devices


def test_pod_request_reads_nvidia_from_the_registry_backend():
    """NVIDIA is a registry backend like the others: its settings are the backend's, and a
    registry without it asks for no GPU (the core has no NVIDIA path of its own)."""
    p = pod(containers=[container("a", gpu=1, gpumem=100)])
    p["spec"]["containers"][0]["resources"]["limits"]["hygon.com/dcunum"] = 1
    renamed = nvidia_registry(NvidiaConfig(memory_factor=4))
    assert pod_request(p, renamed).containers[0] == R(1, "NVIDIA", 400, PERCENT_UNSET, 0)
    both = build_registry({"hygon": {}})
    req = pod_request(p, both)
    assert req.containers[0] == R(1, "NVIDIA", 100, PERCENT_UNSET, 0)
    assert set(req.vendors[0]) == {"DCU"}
    without = {w: v for w, v in both.items() if w != "NVIDIA"}
    req = pod_request(p, without)
    assert req.containers == (None,) and set(req.vendors[0]) == {"DCU"}
    assert not pod_request(p, {}).wants_devices
