from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.sim.trace import TracePod
from hami.sim.workload import gpu_demand, inflate, prepare_workload


def pods(n: int = 10) -> list[TracePod]:
    out = []
    for i in range(n):
        g = [0, 1, 1, 2][i % 4]
        out.append(TracePod(f"p{i}", 1000, 1024, g, 0 if g == 0 else (500 if g == 1 else 1000)))
    return out


def test_inflation_reaches_target_and_stops_there() -> None:
    base = pods()
    out = inflate(base, capacity_milli=10_000, tune=1.3, rng=np.random.default_rng(1))
    assert out[: len(base)] == base
    assert gpu_demand(out) >= 13_000
    assert gpu_demand(out[:-1]) < 13_000
    assert len({p.name for p in out}) == len(out)


def test_same_seed_same_workload_other_seed_differs() -> None:
    a = prepare_workload(pods(), 10_000, seed=42)
    b = prepare_workload(pods(), 10_000, seed=42)
    c = prepare_workload(pods(), 10_000, seed=43)
    assert a == b
    assert [p.name for p in a] != [p.name for p in c]


def test_enough_demand_is_only_shuffled() -> None:
    base = pods()
    out = prepare_workload(base, capacity_milli=100, seed=0)
    assert sorted(p.name for p in out) == sorted(p.name for p in base)
    assert prepare_workload(base, 100, seed=0, shuffle=False) == base


def test_cpu_only_workload_cannot_be_inflated() -> None:
    with pytest.raises(ValueError, match="requests no GPU"):
        inflate([TracePod("c", 1, 1, 0, 0)], 1000, 1.3, np.random.default_rng(0))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(0.5, 3.0), st.integers(1, 30))
def test_inflation_property(seed: int, tune: float, n: int) -> None:
    base = pods(n) + [TracePod("g", 1, 1, 1, 1000)]
    out = prepare_workload(base, 5_000, seed, tune)
    assert len(out) >= len(base)
    if gpu_demand(base) < tune * 5_000:
        assert gpu_demand(out) >= tune * 5_000
        assert gpu_demand(out) - 2000 < tune * 5_000   # stops at the first pod past it
    else:
        assert len(out) == len(base)
    assert out == prepare_workload(base, 5_000, seed, tune)
