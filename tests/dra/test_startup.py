"""hami.dra.startup: the dry-run ResourceSlice the DRA plugin sends before 1.36."""

from __future__ import annotations

import re

from hami.dra import slices
from hami.dra.startup import probe_slice


def test_the_probe_slice_is_this_nodes_and_inside_the_chart_policy_names() -> None:
    doc = probe_slice("node-a")
    prefix = slices.slice_name("node-a")
    name = doc["metadata"]["name"]
    # the chart's DRA admission policy: <node>-gpu.hami.io or ...-(counters|mig)-<k>
    assert name != prefix and name.startswith(prefix + "-")
    assert re.fullmatch(r"(counters|mig)-[0-9]+", name[len(prefix) + 1:])
    spec = doc["spec"]
    assert spec["nodeName"] == "node-a" and spec["pool"]["name"] == "node-a"
    assert spec["driver"] == slices.DRIVER
    (device,) = spec["devices"]
    assert device["allowMultipleAllocations"] is True  # what a server without the gate drops
    assert device["taints"]  # likewise without DRADeviceTaints
    assert device["capacity"]
