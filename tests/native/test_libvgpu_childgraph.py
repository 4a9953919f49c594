"""CUDA graph memory nodes inside child graph nodes, on the stub driver.

CUDA 12.x lets a graph holding allocation and free nodes move into a parent graph
(``cuGraphAddNode`` with a child graph node of ownership ``MOVE``); a graph cloned into a
parent (``cuGraphAddChildGraphNode``) holds none. libvgpu reads the allocation nodes at
instantiation through every child graph level (``cuGraphChildGraphNodeGetGraph``), so a
launch whose allocations, at any depth, would pass the limit is refused before it runs,
exactly as for allocation nodes of the top-level graph
(test_libvgpu_patterns.py::test_graph_launch_past_the_limit_is_refused). The walk is
bounded: at most 16 child graph levels below the instantiated graph and 1,048,576 nodes
(all levels together); a graph past either bound is refused at instantiation with
``CUDA_ERROR_OUT_OF_MEMORY``, never launched unchecked.

``gtree BYTES DEPTH WIDTH MODE RC`` (vgtest, native/libvgpu/tests/vgpat.h) builds a graph
with WIDTH empty nodes and one allocation node of BYTES, DEPTH child graph levels down,
and instantiates it expecting RC. The limit is 48 MiB.
"""

from __future__ import annotations

import pytest
from libvgpu_harness import LIM, LIMIT, OOM, Env, MiB, free_of, lines, phys_of

pytestmark = pytest.mark.native

DEPTH_BOUND = 16
NODE_BOUND = 1 << 20


@pytest.mark.parametrize("depth", [1, 2])
def test_child_graph_past_the_limit_is_refused_before_the_launch(env: Env, depth: int) -> None:
    """16 MiB held: a graph whose allocation node of 40 MiB sits DEPTH child graph levels
    down would pass the 48 MiB limit, so the launch fails with CUDA_ERROR_OUT_OF_MEMORY
    and the device's graph pool allocates nothing; after the 16 MiB are freed it runs."""
    p = env.run("init", "alloc", "mem", str(16 * MiB), "0", "gtree", str(40 * MiB), str(depth), "0", "move", "0",
                "glaunch", OOM, "info", "phys", "0", "gmem", "free", "free",
                "gtree", str(40 * MiB), str(depth), "0", "move", "0", "glaunch", "0", "info", **LIM)
    assert free_of(p.stdout) == [32 * MiB, 8 * MiB]
    assert phys_of(p.stdout) == [16 * MiB]
    assert lines(p.stdout, "gmem") == [[0, 0]]
    assert "cuGraphLaunch: the graph's allocations need" in p.stderr


@pytest.mark.parametrize("depth", [1, 2, DEPTH_BOUND])
def test_child_graph_within_the_limit_runs_and_is_counted_like_a_top_level_one(env: Env, depth: int) -> None:
    """The 40 MiB taken by an allocation node DEPTH levels down are counted from the launch
    (8 MiB left, one byte more refused); freed with cuMemFreeAsync they stay in the graph
    pool, counted, until cuDeviceGraphMemTrim: the same figures as the top-level graph's."""
    runs = {}
    for d in (0, depth):
        runs[d] = env.run("init", "gtree", str(40 * MiB), str(d), "0", "move", "0", "glaunch", "0", "info",
                          "alloc", "mem", str(8 * MiB + 1), OOM, "gfree", "info", "gmem", "gtrim", "info",
                          "phys", "0", **LIM)
    for p in runs.values():
        assert free_of(p.stdout) == [8 * MiB, 8 * MiB, LIMIT]
        assert lines(p.stdout, "gmem") == [[40 * MiB, 0]]
        assert phys_of(p.stdout) == [0]


def test_child_graph_nesting_past_the_bound_is_refused_not_unchecked(env: Env) -> None:
    """16 child graph levels are read; a graph with a 17th is refused at instantiation,
    with or without an allocation node in it (its nodes past the bound were not read),
    moved or cloned; at the bound it instantiates and its launch is checked."""
    p = env.run("init", "gtree", "4096", str(DEPTH_BOUND + 1), "0", "move", OOM,
                "gtree", "0", str(DEPTH_BOUND + 1), "1", "clone", OOM,
                "gtree", "0", str(DEPTH_BOUND), "1", "clone", "0", "glaunch", "0",
                "alloc", "mem", str(16 * MiB), "0", "gtree", str(40 * MiB), str(DEPTH_BOUND), "0", "move", "0",
                "glaunch", OOM, "gmem", **LIM)
    assert [ln[0] for ln in lines(p.stdout, "gtree")] == [2, 2, 0, 0]
    assert lines(p.stdout, "gmem") == [[0, 0]]
    assert p.stderr.count(f"more than {DEPTH_BOUND} levels of child graphs; refused") == 2, p.stderr


def test_child_graph_node_count_past_the_bound_is_refused_not_unchecked(env: Env) -> None:
    """1,048,576 nodes, all levels together, are read (top: the child graph node; the
    child: empty nodes and the allocation node); one node more is refused at
    instantiation."""
    p = env.run("init", "gtree", "4096", "1", str(NODE_BOUND - 2), "move", "0", "glaunch", "0",
                "gtree", "4096", "1", str(NODE_BOUND - 1), "move", OOM, **LIM)
    assert [ln[0] for ln in lines(p.stdout, "gtree")] == [0, 2]
    assert f"more than {NODE_BOUND} nodes; refused" in p.stderr, p.stderr


def test_graphs_moved_into_parents_do_not_fill_the_tracking_table(env: Env) -> None:
    """A graph moved into a parent is destroyed with the parent (cuGraphDestroy is never
    called on it), so nothing is recorded per graph before instantiation (which reads the
    graph): 300 graphs with an allocation node moved into parents that are kept, and 300
    instantiated and destroyed, leave the next graph's allocation node accepted and
    checked."""
    p = env.run("init", *(["gtree", "4096", "1", "0", "hold", "0"] * 300),
                *(["gtree", "4096", "1", "0", "move", "0", "free"] * 300), "graph", str(MiB), "1",
                "glaunch", "0", "info", "alloc", "mem", str(16 * MiB), "0", "graph", str(40 * MiB), "1",
                "glaunch", OOM, **LIM)
    assert free_of(p.stdout) == [LIMIT - MiB]


def test_stub_models_the_documented_child_graph_rules(env: Env) -> None:
    """The stub's child graph nodes follow the driver API reference: a clone refuses memory
    nodes, a moved graph belongs to its parent (not instantiated, destroyed, moved again or
    given memory nodes on its own; cuGraphChildGraphNodeGetGraph returns it), and no graph
    moves into itself or its own child."""
    for preload in (True, False):
        p = env.run("init", "gchildrules", preload=preload)
        assert "gchildrules ok" in p.stdout
