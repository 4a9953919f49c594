"""The prefilter's per-shape device counts and the fragmentation state follow every
ledger change (issue 17): both recount only the nodes the ledger stamped since they last
looked, so after any sequence of pod and node changes they must agree with a recount from
scratch."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core.fit import PodOptions
from hami.core.fragmentation import WorkloadDistribution
from hami.core.fragmentation.state import FragmentationState, node_types
from hami.core.ledger import UsageLedger
from hami.core.model import (
    ContainerDevice,
    ContainerDeviceRequest,
    DeviceInfo,
    MigPlacement,
    PodRequest,
)
from hami.core.prefilter import _share_counts, node_mask
from hami.sim.mig import mig_device, mig_model

#: Enough nodes that one or two changed ones are recounted alone, not the whole cluster.
NODES = tuple(f"n{i}" for i in range(20))
TYPES = ("NVIDIA-T4", "NVIDIA-A10")
SHAPES = (ContainerDeviceRequest(1, cores_percent=30, memory_percent=30),
          ContainerDeviceRequest(2, cores_percent=50, memory_percent=50),
          ContainerDeviceRequest(1, cores_percent=100, memory_percent=100),
          ContainerDeviceRequest(1, memory_mib=4000),
          ContainerDeviceRequest(1, type="A10", cores_percent=10, memory_percent=10))


def devices(node: str, n: int, kind: int, healthy: bool = True) -> list[DeviceInfo]:
    return [DeviceInfo(f"{node}-gpu{i}", i, 4, 16384, 100, TYPES[kind], health=healthy)
            for i in range(n)]


def mig_devices(n: int) -> list[DeviceInfo]:
    model = mig_model("A100-40GB")
    assert model is not None
    return [mig_device(f"m-gpu{i}", i, "NVIDIA-A100-SXM4-40GB", model) for i in range(n)]


def request(shape: ContainerDeviceRequest, cpu_milli: int = 0) -> PodRequest:
    return PodRequest("ns", "p", "u", (shape,), cpu_milli=cpu_milli)


def fresh_terms(led: UsageLedger, dist: WorkloadDistribution) -> FragmentationState:
    state = FragmentationState(dist, node_types(led))
    state.refresh_from_ledger(led)
    return state


op = st.one_of(
    st.tuples(st.just("add_pod"), st.integers(0, 30), st.sampled_from(NODES),
              st.integers(0, 3), st.integers(0, 3), st.integers(5, 100)),
    st.tuples(st.just("remove_pod"), st.integers(0, 30)),
    st.tuples(st.just("shrink_pod"), st.integers(0, 30)),
    st.tuples(st.just("add_node"), st.sampled_from(NODES), st.integers(0, 4),
              st.integers(0, 1), st.booleans(), st.integers(0, 8000)),
    st.tuples(st.just("remove_node"), st.sampled_from(NODES)),
    st.tuples(st.just("mig_pod"), st.integers(0, 30), st.integers(0, 1), st.integers(1, 3),
              st.booleans()),
    st.tuples(st.just("decide"),),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=40))
def test_cached_counts_and_terms_equal_a_recount_after_any_change(ops: list[tuple]) -> None:
    led = UsageLedger(capacity=2)  # arrays grow during the test too
    for i, name in enumerate(NODES):
        led.add_node(name, devices(name, 2 + i % 2, i % 2), cpu_milli=8000, memory_mib=32768)
    led.add_node("m", mig_devices(2), cpu_milli=8000, memory_mib=32768)  # MIG-mode rows
    dist = WorkloadDistribution.from_tasks([1, 1, 2, 0], [300, 1000, 500, 0],
                                           [1000, 2000, 0, 4000], [0, 0, 0, 0])
    state = fresh_terms(led, dist)
    version = led.version
    pod = PodOptions(gpu_policy="binpack")
    for step in ops:
        kind = step[0]
        if kind == "add_pod":
            _, uid, node, first, second, cores = step
            grant = tuple(ContainerDevice(f"{node}-gpu{g}", "NVIDIA-T4", 1000 * cores // 10,
                                          cores) for g in sorted({first, second}))
            led.add_pod(f"u{uid}", node, ((grant[0],), grant), n_init=1, cpu_milli=500)
        elif kind == "remove_pod":
            led.remove_pod(f"u{step[1]}")
        elif kind == "shrink_pod":
            led.shrink_pod(f"u{step[1]}")
        elif kind == "add_node":
            _, node, n, type_kind, healthy, cpu = step
            led.add_node(node, devices(node, n, type_kind, healthy), cpu_milli=cpu,
                         memory_mib=32768)
        elif kind == "remove_node":
            led.remove_node(step[1])
        elif kind == "mig_pod":  # instances take the GPU's slots; unreserved: fail closed
            _, uid, gpu, count, reserved = step
            uuid = f"m-gpu{gpu}"
            grant = tuple(ContainerDevice(uuid, "NVIDIA-A100-SXM4-40GB", 5120, 14)
                          for _ in range(count))
            mig = tuple((uuid, MigPlacement(k, 1)) for k in range(count)) if reserved else ()
            led.add_pod(f"u{uid}", "m", (grant,), cpu_milli=500, mig=mig)
        if led.version != version:  # as FragmentationScorer does: a new state
            state, version = fresh_terms(led, dist), led.version
        else:
            state.refresh_from_ledger(led)
        recount = fresh_terms(led, dist)
        for got, want in ((state.total, recount.total), (state.s, recount.s),
                          (state.c, recount.c), (state.frag, recount.frag),
                          (state.cpu_free, recount.cpu_free), (state._free, recount._free)):
            assert np.array_equal(got, want)
        for shape in SHAPES:
            cached = node_mask(led, request(shape, 1000), pod)
            counts = _share_counts(led, shape, pod).tolist()  # MIG GPUs: one per free slot
            saved, led.derived = led.derived, {}
            assert cached.tolist() == node_mask(led, request(shape, 1000), pod).tolist()
            assert counts == _share_counts(led, shape, pod).tolist()
            led.derived = saved
