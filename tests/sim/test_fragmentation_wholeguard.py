"""The whole-node guard of the stranding term (:mod:`hami.core.fragmentation.wholeguard`),
by hand and on a two-node cluster; the live order applies it when the mix holds a
multi-GPU class."""

from __future__ import annotations

import math

import numpy as np

from hami.core.fragmentation.wholeguard import (
    GAP_MILLI,
    guard_whole_nodes,
    mix_needs_whole_nodes,
)
from hami.sim.replay import FRAGMENTATION_AWARE, Replayer, workload_distribution
from hami.sim.trace import TraceNode, TracePod


def test_guard_by_hand() -> None:
    # Nodes 0 and 1 have all GPUs free, 2 and 3 are busy, 4 cannot take the request.
    plain = np.array([10.0, 12.0, 11.0, 20.0, math.inf])
    term = np.array([0.0, 0.0, -5.0, 0.0, 0.0])
    whole = np.array([True, True, False, False, True])
    got = guard_whole_nodes(plain, term, whole)
    # Without the term a whole node is best (10 < 11): whole nodes keep their plain
    # growth; the busy ones (6 and 20 with the term) are shifted by 5 to start
    # GAP_MILLI behind 10.
    assert got.tolist() == [10.0, 12.0, 10.0 + GAP_MILLI, 24.0 + GAP_MILLI, math.inf]
    # A busy node best without the term: busy nodes keep plain + term (35, 20), whole
    # ones come after the best busy one however small their plain growth.
    plain[2], term[2] = 5.0, 30.0
    got = guard_whole_nodes(plain, term, whole)
    assert got[2:4].tolist() == [35.0, 20.0]
    assert got[:2].tolist() == [20.0 + GAP_MILLI, 22.0 + GAP_MILLI]


def test_one_group_only_is_plain_plus_term_on_busy_nodes() -> None:
    got = guard_whole_nodes(np.array([1.0, 2.0]), np.array([5.0, 5.0]),
                            np.array([False, False]))
    assert got.tolist() == [6.0, 7.0]
    got = guard_whole_nodes(np.array([1.0, 2.0]), np.array([5.0, 5.0]),
                            np.array([True, True]))
    assert got.tolist() == [1.0, 2.0]


# A CPU-rich node with all 8 GPUs free and a busy CPU-poor one; a share, a CPU-heavy
# share, then an 8-GPU pod with 120 cores that only the CPU-rich node can take.
NODES = [TraceNode("rich", 128000, 786432, 8, "G3"), TraceNode("busy", 64000, 262144, 8, "G2")]
PODS = [TracePod("first", 4000, 4096, 1, 500), TracePod("heavy", 24000, 8192, 1, 500),
        TracePod("eight", 120000, 524288, 8, 1000)]
MIX = PODS + [TracePod(f"mix{i}", 2000, 4096, 1, 500) for i in range(6)]


def _placed(stranding_weight: float, guard: bool) -> list[str | None]:
    rep = Replayer(NODES, FRAGMENTATION_AWARE, workload_distribution(MIX))
    rep.scorer.stranding_weight = stranding_weight
    rep.scorer.whole_node_guard = guard
    return [rep.schedule(rep.shapes.request(p))[0] for p in PODS]


def test_the_guard_keeps_the_only_whole_node_whole() -> None:
    """``heavy`` would strand GPU on ``busy`` (24 of its 60 free cores), none on
    ``rich``: the term alone sends it to ``rich``, the only node with all GPUs free, and
    the 8-GPU pod then fits nowhere. Without the term FGD keeps ``heavy`` on the busy
    node; with the guard, whether to break ``rich`` is decided as without the term."""
    assert _placed(3.0, False) == ["busy", "rich", None]
    assert _placed(0.0, False) == ["busy", "busy", "rich"]
    assert _placed(3.0, True) == ["busy", "busy", "rich"]


def test_ties_go_to_less_free_cpu_with_the_guard() -> None:
    """Two whole 8-GPU nodes of equal growth: the guard's tie-break takes the one with
    less free CPU even when it is listed second."""
    nodes = [TraceNode("rich", 128000, 786432, 8, "G3"),
             TraceNode("lean", 96000, 393216, 8, "G2")]
    pod = TracePod("eight", 64000, 262144, 8, 1000)
    for guard, want in [(False, "rich"), (True, "lean")]:
        rep = Replayer(nodes, FRAGMENTATION_AWARE, workload_distribution([pod]))
        rep.scorer.whole_node_guard = guard
        assert rep.schedule(rep.shapes.request(pod))[0] == want


def test_the_live_order_guards_whole_nodes_when_the_mix_has_multi_gpu_tasks() -> None:
    """The scorer as the live scheduler and ``hami simulate`` build it (no guard setting):
    with an 8-GPU class in the mix the 8-GPU pod finds the CPU-rich node whole."""
    rep = Replayer(NODES, FRAGMENTATION_AWARE, workload_distribution(MIX))
    assert rep.scorer.whole_node_guard is None and rep.scorer.stranding_weight > 0
    assert rep.scorer.guarded()
    assert [rep.schedule(rep.shapes.request(p))[0] for p in PODS] == ["busy", "busy", "rich"]


def test_a_mix_of_single_gpu_tasks_keeps_the_term_unguarded() -> None:
    singles = [p for p in MIX if p.num_gpu == 1]
    assert not mix_needs_whole_nodes(workload_distribution(singles))
    assert mix_needs_whole_nodes(workload_distribution(MIX))
    placed = {}
    for guard in (None, False, True):
        rep = Replayer(NODES, FRAGMENTATION_AWARE, workload_distribution(singles))
        rep.scorer.whole_node_guard = guard
        placed[guard] = [rep.schedule(rep.shapes.request(p))[0] for p in PODS[:2]]
    assert placed[None] == placed[False] == ["rich", "rich"]  # as the term alone ranks
    assert placed[True] == ["busy", "busy"]  # the guard would have kept "rich" whole
    assert not rep.scorer.guarded() or rep.scorer.whole_node_guard
    rep.scorer.stranding_weight = 0.0
    rep.scorer.whole_node_guard = None
    assert not rep.scorer.guarded()
