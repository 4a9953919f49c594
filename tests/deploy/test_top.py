"""``hami top``'s view of a known cluster state (pure: no cluster needed)."""

from __future__ import annotations

import json

from hami.top import cluster_view, render_table
from tests.deploy.top_cluster import EXPECTED, objects


def test_view_of_known_state() -> None:
    nodes, pods, quotas = objects()
    view = cluster_view(nodes, pods, quotas)
    assert json.loads(json.dumps(view)) == EXPECTED


def test_view_is_independent_of_listing_order() -> None:
    nodes, pods, quotas = objects()
    view = cluster_view(reversed(nodes), list(reversed(pods)), quotas)
    assert json.loads(json.dumps(view)) == EXPECTED


def test_table_shows_nodes_gpus_pods_and_problems() -> None:
    text = render_table(cluster_view(*objects()), width=220)
    lines = text.splitlines()
    row = next(line for line in lines if "GPU-top-a-0" in line)
    for cell in ("6000/16384 (37%)", "30/100 (30%)", "2/10", "team-a/infer-1(2000,0)",
                 "team-a/train-0(4000,30)"):
        assert cell in row, (cell, row)
    assert "cordoned" in next(line for line in lines if "GPU-top-b-2" in line)
    assert "unhealthy" in next(line for line in lines if "GPU-top-b-3" in line)
    node_row = next(line for line in lines if line.lstrip("│ ").startswith("top-a"))
    assert "10000/32768 (30%)" in node_row and "2026-01-01T00:00:00Z,team-a,train-0" in node_row
    assert "no gpu found on node" in text and "phase Succeeded" in text
    assert "10000/20000" in text  # team-a quota
