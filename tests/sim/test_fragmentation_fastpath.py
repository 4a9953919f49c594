"""The live ``fragmentation-aware`` decision's fast paths (issue 17: its p99 within 2x of
binpack's at 1,000 nodes) compute what the vectorised measure does: the one node an
ordinary decision changes is refreshed and scored in plain Python, and a request shape
seen for the first time is scored on every node at once from a [nodes, GPUs] table."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core.fragmentation import (
    FragmentationScorer,
    FragmentationState,
    Placement,
    WorkloadDistribution,
    class_terms,
    frag_delta,
    fragment,
    ledger_inputs,
    node_types,
)
from hami.core.fragmentation import order as order_module
from hami.core.fragmentation import state as state_module
from hami.core.fragmentation.scalar import Classes, node_growth, node_row, share_growth
from hami.core.ledger import UsageLedger
from hami.core.model import ContainerDevice, DeviceInfo

TYPES = ["NVIDIA-Tesla-T4", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A10"]


def mix(seed: int) -> WorkloadDistribution:
    """A random task mix: shares, whole and multi-GPU tasks, CPU-only ones, CPU and
    memory needs, some tied to a GPU type. At most 40 tasks, so no weight has more than
    3 decimals' worth of factors 2 and 5 (no growth falls on a rounding midpoint)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 41))
    return WorkloadDistribution.from_tasks(
        rng.choice([0, 1, 1, 1, 2, 4], n).tolist(),
        rng.choice([100, 250, 300, 500, 999, 1000], n).tolist(),
        rng.choice([0, 500, 1000, 8000], n).tolist(),
        rng.choice([0, 0, 4096, 65536], n).tolist(),
        [list(rng.choice(["t4", "a100"], 1)) if rng.random() < 0.3 else []
         for _ in range(n)])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.integers(0, 1000), min_size=0, max_size=8),
       st.integers(-1000, 20_000), st.integers(-100, 100_000),
       st.sampled_from([(100, 1), (250, 1), (999, 1), (1000, 1), (1000, 2), (300, 2), (0, 0)]),
       st.integers(0, 4000))
def test_one_node_in_python_is_the_vectorised_measure(seed: int, free: list[int], cpu: int,
                                                       mem: int, shape: tuple[int, int],
                                                       cpu_req: int) -> None:
    dist = mix(seed)
    ok = np.random.default_rng(seed + 1).random(dist.size) < 0.8
    total, s, c = class_terms(np.array(free, dtype=np.int64),
                              np.zeros(len(free), dtype=np.int64), 1, dist)
    cpu_a, mem_a = np.array([cpu]), np.array([mem])
    frag = fragment(total, s, c, cpu_a, mem_a, ok[None, :], dist) @ dist.weight
    row = node_row(free, cpu, mem, ok.tolist(), Classes.of(dist))
    assert (row.total, list(row.s), list(row.c)) == (total[0], s[0].tolist(), c[0].tolist())
    assert row.frag == pytest.approx(float(frag[0]), rel=1e-12, abs=1e-9)
    request, gpus = shape
    if gpus == 1 and 0 < request < 1000:
        rows = [f for f in free if f >= request]
        expected = np.inf
        if rows:
            n = len(rows)
            expected = float(frag_delta(
                np.repeat(total, n), np.repeat(s, n, axis=0), np.repeat(c, n, axis=0),
                np.repeat(frag, n), np.repeat(cpu_a, n), np.repeat(mem_a, n),
                np.repeat(ok[None, :], n, axis=0), dist, request_milli=request, num_gpu=1,
                cpu_milli=cpu_req, memory_mib=0,
                device_free=np.array(rows, dtype=np.float64)).min())
        got = share_growth(row, Classes.of(dist), request_milli=request, cpu_milli=cpu_req,
                           memory_mib=0)
    else:
        expected = float(frag_delta(total, s, c, frag, cpu_a, mem_a, ok[None, :], dist,
                                    request_milli=request, num_gpu=gpus, cpu_milli=cpu_req,
                                    memory_mib=0)[0])
        got = node_growth(row, Classes.of(dist), request_milli=request, num_gpu=gpus,
                          cpu_milli=cpu_req, memory_mib=0)
    assert got == expected


def cluster(nodes: int, seed: int) -> UsageLedger:
    """``nodes`` nodes of 1-8 GPUs of three types, each GPU holding a random share."""
    rng = np.random.default_rng(seed)
    led = UsageLedger()
    for n in range(nodes):
        gpus = int(rng.integers(1, 9))
        led.add_node(f"n{n}", [DeviceInfo(f"n{n}-g{i}", i, 10, 16384, 100, TYPES[n % 3])
                               for i in range(gpus)], cpu_milli=int(rng.choice([-1, 16000])),
                     memory_mib=262144)
        for g in range(gpus):
            add_random_pod(led, rng, n, g, f"r{n}-{g}")
    return led


def add_random_pod(led: UsageLedger, rng: np.random.Generator, node: int, gpu: int,
                   uid: str) -> None:
    cores = int(rng.choice([0, 0, 10, 20, 30, 50, 60, 100]))
    if cores:
        led.add_pod(uid, f"n{node}", ((ContainerDevice(f"n{node}-g{gpu}", "NVIDIA", 1024,
                                                       cores),),),
                    cpu_milli=int(rng.choice([0, 2000, 6000])))


def least_by_device(state: FragmentationState, request: int, cpu: int) -> np.ndarray:
    """Per node, the least growth over its GPUs one device at a time (the reference)."""
    assert state._free is not None
    best = np.full(state.total.shape[0], np.inf)
    devices = np.flatnonzero((state.node_of >= 0) & (state._free >= request))
    each = state.delta_devices(devices, state.node_of, state._free, request_milli=request,
                               cpu_milli=cpu, memory_mib=0)
    np.minimum.at(best, state.node_of[devices], each)
    return best


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([10, 100, 250, 500, 700, 990]),
       st.integers(0, 8000))
def test_share_growth_on_every_node_follows_the_ledger(seed: int, share: int,
                                                       cpu: int) -> None:
    # The [nodes, GPUs] table is kept up to date node by node (ordinary decisions) and
    # refilled after a refresh of many nodes at once or from explicit arrays.
    rng = np.random.default_rng(seed)
    led = cluster(40, seed)
    state = FragmentationState(mix(seed), node_types(led))
    for step in range(6):
        if step % 3 == 2:
            state.refresh(*ledger_inputs(led))
        else:
            state.refresh_from_ledger(led)
        got = state.least_share_all(request_milli=share, cpu_milli=cpu, memory_mib=0)
        assert got is not None
        assert got.tolist() == least_by_device(state, share, cpu).tolist()
        touched = rng.choice(40, 1 if step % 2 else 9, replace=False)
        for n in touched.tolist():
            g = int(rng.integers(0, len(led.node(f"n{n}").devices)))  # type: ignore[union-attr]
            led.remove_pod(f"r{n}-{g}")  # one pod per GPU: shares stay in 0..1000
            add_random_pod(led, rng, n, g, f"r{n}-{g}")


def test_share_growth_on_every_node_with_out_of_range_shares_is_declined() -> None:
    # A GPU whose free share lies outside 0..1000 (more cores used than it has): the
    # table declines and the caller goes device by device.
    led = cluster(12, 3)
    led.add_pod("over", "n0", ((ContainerDevice("n0-g0", "NVIDIA", 1024, 150),),))
    state = FragmentationState(mix(3), node_types(led))
    state.refresh_from_ledger(led)
    assert state.least_share_all(request_milli=100, cpu_milli=0, memory_mib=0) is None
    scorer = FragmentationScorer(mix(3), model_pressure_weight=0.0,  # the growth alone
                                 stranding_weight=0.0)
    idx = np.arange(led.node_count)
    deltas = scorer.node_deltas(led, Placement(100, 1, 0, 0), idx)
    assert deltas.tolist() == least_by_device(scorer.state(led), 100, 0).tolist()


def test_an_ordinary_decision_scores_the_changed_node_in_python(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Once every shape is cached, a pod added on one node is reflected without the
    # vectorised class terms or growth (a few dozen numpy calls on arrays of a handful of
    # elements cost more than the arithmetic), ordering as a new scorer does.
    led = cluster(30, 5)
    dist = mix(5)
    scorer = FragmentationScorer(dist)
    idx = np.arange(led.node_count)
    shapes = [Placement(100, 1, 1000, 0), Placement(1000, 2, 0, 0), Placement(300, 1, 0, 0)]
    for p in shapes:
        scorer.order(led, p, idx)

    def vectorised(*args: object, **kwargs: object) -> None:
        raise AssertionError("an ordinary decision took the vectorised path")

    rng = np.random.default_rng(5)
    for _ in range(10):
        n = int(rng.integers(0, 30))
        led.remove_pod(f"r{n}-0")
        add_random_pod(led, rng, n, 0, f"r{n}-0")
        with monkeypatch.context() as m:
            m.setattr(state_module, "class_terms", vectorised)
            m.setattr(order_module.FragmentationScorer, "_compute", vectorised)
            ranked = [scorer.order(led, p, idx).tolist() for p in shapes]
        assert ranked == [FragmentationScorer(dist).order(led, p, idx).tolist()
                          for p in shapes]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([(1000, 1), (1000, 2), (300, 2), (0, 0),
                                                (0, 1), (1000, 8)]),
       st.integers(0, 8000))
def test_whole_gpu_growth_on_every_node_is_per_node_frag_delta(
        seed: int, shape: tuple[int, int], cpu: int) -> None:
    led = cluster(40, seed)
    state = FragmentationState(mix(seed), node_types(led))
    state.refresh_from_ledger(led)
    request, gpus = shape
    every = state.delta_all(request_milli=request, num_gpu=gpus, cpu_milli=cpu, memory_mib=0)
    each = state.delta_nodes(np.arange(40), request_milli=request, num_gpu=gpus,
                             cpu_milli=cpu, memory_mib=0)
    assert every.tolist() == each.tolist()
