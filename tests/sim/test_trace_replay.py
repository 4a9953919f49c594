"""CI replay of the real trace: ``default``, one seed (skipped without the trace)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hami.sim.replay import FRAGMENTATION_AWARE, replay, workload_distribution
from hami.sim.trace import load_reference, load_trace
from hami.sim.workload import prepare_workload

pytestmark = pytest.mark.trace

SEED42_UNALLOCATED_AT_100 = 4.31


def test_default_replay_is_sane_reproducible_and_beats_bestfit(trace_dir: Path) -> None:
    nodes, pods = load_trace(trace_dir, "default")
    cap = 1000 * sum(n.gpu for n in nodes)
    workload = prepare_workload(pods, cap, seed=42)
    assert len(workload) > len(pods)
    dist = workload_distribution(pods)
    res = replay(nodes, workload, FRAGMENTATION_AWARE, dist, seed=42)
    assert res.pods == len(workload) and res.scheduled + res.failed == res.pods
    # Up to ~70 % arrived demand every pod fits: nothing is left unallocated but the
    # demand that has not arrived yet.
    assert res.unallocated(50) == pytest.approx(50, abs=0.2)
    curve = [res.allocation[p] for p in range(0, 131)]
    assert all(x <= y + 1e-9 for x, y in zip(curve, curve[1:], strict=False))
    at100 = res.unallocated(100)
    reference = load_reference(trace_dir, "default")
    bestfit = reference.get("05-BestFit", {}).get(100, 7.09)
    assert 2.0 < at100 < bestfit, at100
    # Regression oracle: 4.31 % on this code (3.93 % with the stranding term but without the
    # whole-node guard, 4.71 % before the stranding term, 5.15 % before
    # the packing tie-break); a core change that moves it further than the seeds do
    # deserves a look.
    assert at100 == pytest.approx(SEED42_UNALLOCATED_AT_100, abs=0.6)
    assert 0 < res.fragmentation[100] < 10
    # Reproducible: the same seed gives the same first 3000 decisions.
    a = replay(nodes, workload[:3000], FRAGMENTATION_AWARE, dist, seed=42)
    b = replay(nodes, workload[:3000], FRAGMENTATION_AWARE, dist, seed=42)
    reached = [p for p in range(0, 131) if not math.isnan(a.allocation[p])]
    assert reached and [a.allocation[p] for p in reached] == [b.allocation[p] for p in reached]
    assert a.failed == b.failed
    assert a.allocation[30] == res.allocation[30]
