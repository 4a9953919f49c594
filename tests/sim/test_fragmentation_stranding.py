"""The CPU and memory stranding term of the ``fragmentation-aware`` order
(:mod:`hami.core.fragmentation.stranding`), on clusters small enough to follow by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hami.core.fragmentation import WorkloadDistribution
from hami.core.fragmentation.stranding import MixRatios, stranded, stranding_growth
from hami.sim.replay import FRAGMENTATION_AWARE, Replayer, workload_distribution
from hami.sim.trace import TraceNode, TracePod


def test_ratios_and_stranded_by_hand() -> None:
    # Half whole GPUs with 8 cores, half 500m shares with 2 cores: 750 GPU milli per
    # 5,000 CPU milli (0.15), 750 per 3,072 MiB; a CPU-only class would not count.
    d = WorkloadDistribution.from_tasks([1, 1], [1000, 500], [8000, 2000], [4096, 2048])
    r = MixRatios.of(d)
    assert r.gpu_per_cpu_milli == pytest.approx(0.15)
    assert r.gpu_per_memory_mib == pytest.approx(750 / 3072)
    # 2000m free GPU: 4 cores serve 600 (1400 stranded); 20 cores serve all; memory:
    # 4096 MiB serve 1000 (1000 stranded); negative free CPU serves nothing.
    got = stranded(np.array([2000.0, 2000.0, 2000.0, 2000.0]),
                   np.array([4000, 20000, 20000, -5]), np.array([10**6, 10**6, 4096, 10**6]),
                   r)
    assert got.tolist() == pytest.approx([1400, 0, 1000, 2000])
    # Placing a 500m share with 2 cores on the first node: 1500 - 0.15 x 2000 = 1200.
    grown = stranding_growth(np.array([2000.0]), np.array([4000]), np.array([10**6]), r,
                             gpu_milli=500, cpu_milli=2000, memory_mib=0)
    assert grown.tolist() == pytest.approx([-200])


def test_a_mix_without_cpu_strands_nothing() -> None:
    r = MixRatios.of(WorkloadDistribution.from_tasks([1], [500], [0], [0]))
    assert math.isinf(r.gpu_per_cpu_milli) and math.isinf(r.gpu_per_memory_mib)
    assert stranded(np.array([1000.0]), np.array([0]), np.array([0]), r).tolist() == [0]


# Two one-GPU nodes, 16 and 8 cores. A whole GPU with 8 cores, then two 500m shares with
# 1 and 8 cores.
NODES = [TraceNode("big", 16000, 65536, 1, "G2"), TraceNode("small", 8000, 65536, 1, "G2")]
PODS = [TracePod("whole", 8000, 1024, 1, 1000), TracePod("light", 1000, 1024, 1, 500),
        TracePod("heavy", 8000, 1024, 1, 500)]


def test_cpu_is_kept_in_step_with_the_gpu() -> None:
    """FGD's growth ties for ``whole`` (0 on both nodes) and the tie goes to the first
    node, ``big``, whose other 8 cores then have no GPU; ``light`` takes half of
    ``small``'s GPU and 1 of its cores, and ``heavy`` (8 cores) fits nowhere. With the
    stranding term ``small``'s GPU is partly stranded already (8 cores serve 941 of its
    1000 milli at the mix's 0.118 milli per core), so ``whole`` goes there and all three
    pods are placed."""
    rep = Replayer(NODES, FRAGMENTATION_AWARE, workload_distribution(PODS))
    placed = [rep.schedule(rep.shapes.request(p))[0] for p in PODS]
    assert placed == ["small", "big", "big"]
    assert rep.allocation_percent() == pytest.approx(100.0)


def test_without_the_term_the_gpu_is_stranded() -> None:
    rep = Replayer(NODES, FRAGMENTATION_AWARE, workload_distribution(PODS))
    rep.scorer.stranding_weight = 0.0
    placed = [rep.schedule(rep.shapes.request(p))[0] for p in PODS]
    assert placed == ["big", "small", None]
