"""The GPU-model pressure term of the ``fragmentation-aware`` order
(:mod:`hami.core.fragmentation.pressure`), on clusters small enough to follow by hand."""

from __future__ import annotations

import numpy as np
import pytest

from hami.core.fragmentation import WorkloadDistribution, model_mask
from hami.core.fragmentation.pressure import model_pressure
from hami.sim.replay import FRAGMENTATION_AWARE, Replayer, workload_distribution
from hami.sim.trace import TraceNode, TracePod


def test_pressure_by_hand() -> None:
    # Demand: 0.5 x 1000 (any model) + 0.5 x 1000 (T4 only); the T4 node holds 1 of the
    # cluster's 4 GPUs: the T4-only half of a full cluster's demand, 2 GPUs, on 1 GPU.
    d = WorkloadDistribution.from_tasks([1, 1], [1000, 1000], [0, 0], [0, 0],
                                        [(), ("T4",)])
    ok = model_mask(["NVIDIA-T4", "NVIDIA-G2", "NVIDIA-G2"], d)
    assert model_pressure(ok, np.array([1, 2, 1]), d).tolist() == pytest.approx([2, 0, 0])
    # A class accepting both models spreads over all four GPUs: 0.5 x 4 / 4 everywhere.
    both = WorkloadDistribution.from_tasks([1, 1], [1000, 1000], [0, 0], [0, 0],
                                           [(), ("T4", "G2")])
    ok = model_mask(["NVIDIA-T4", "NVIDIA-G2", "NVIDIA-G2"], both)
    assert model_pressure(ok, np.array([1, 2, 1]), both).tolist() == pytest.approx(
        [0.5, 0.5, 0.5])


def test_no_constraint_no_pressure() -> None:
    d = WorkloadDistribution.from_tasks([1, 0], [500, 0], [0, 5], [0, 5])
    ok = model_mask(["NVIDIA-T4", "NVIDIA-G2"], d)
    assert model_pressure(ok, np.array([2, 8]), d).tolist() == [0, 0]


# A T4 node with one GPU, a G2 node with two. The mix: a quarter each of a T4-only 300m
# share, a whole GPU, a 300m share, a T4-only 500m share, arriving in that order.
NODES = [TraceNode("t4", 16000, 65536, 1, "T4"), TraceNode("g2", 16000, 65536, 2, "G2")]
PODS = [TracePod("t4-share", 1000, 1024, 1, 300, ("T4",)),
        TracePod("whole", 1000, 1024, 1, 1000),
        TracePod("share", 1000, 1024, 1, 300),
        TracePod("t4-half", 1000, 1024, 1, 500, ("T4",))]


def test_scarce_model_is_kept_for_the_tasks_that_need_it() -> None:
    """FGD's growth ties for ``share`` between the T4 GPU (700m free) and the free G2 GPU
    (+25m both) and the tie goes to the node with less free GPU, the T4 one, where the
    T4-only ``t4-half`` then no longer fits. With the pressure term (the T4-only classes
    ask 200 of the mix's 525m, i.e. 1.14 of the T4 GPU on a full cluster) ``share`` goes
    to the G2 node and every pod is placed."""
    rep = Replayer(NODES, FRAGMENTATION_AWARE, workload_distribution(PODS))
    placed = [rep.schedule(rep.shapes.request(p))[0] for p in PODS]
    assert placed == ["t4", "g2", "g2", "t4"]
    assert rep.allocation_percent() == pytest.approx(100 * 2100 / 3000)


def test_without_the_term_the_order_is_fgds() -> None:
    rep = Replayer(NODES, FRAGMENTATION_AWARE, workload_distribution(PODS))
    rep.scorer.model_pressure_weight = 0.0
    placed = [rep.schedule(rep.shapes.request(p))[0] for p in PODS]
    assert placed == ["t4", "g2", "t4", None]
