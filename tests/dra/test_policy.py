"""DRA mode node policy: prioritize scores from slice capacity and claim consumption."""

from __future__ import annotations

from typing import Any

import pytest

from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import PhysicalGpu
from hami.deviceplugin.register import node_devices
from hami.dra import policy
from hami.dra.slices import resource_slice


def _slice(node: str) -> dict[str, Any]:
    gpus = [PhysicalGpu(f"GPU-{node}-{i}", i, "Tesla T4", 1000 * 2**20) for i in range(2)]
    return resource_slice(node, node_devices(gpus, PluginConfig()))


def _claim(node: str, mib: int) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [
        {"driver": "gpu.hami.io", "pool": node, "device": "gpu-0",
         "consumedCapacity": {"memory": f"{mib}Mi", "cores": "0", "shares": "1"}},
        {"driver": "other.example.com", "pool": node, "device": "x",
         "consumedCapacity": {"memory": "1Ti"}}]}}}}


def test_binpack_prefers_fuller_nodes_spread_emptier() -> None:
    use = policy.memory_use([_slice("a"), _slice("b")], [_claim("a", 1500), _claim("b", 500)])
    assert use == {"a": (1500 * 2**20, 2000 * 2**20), "b": (500 * 2**20, 2000 * 2**20)}
    assert policy.node_scores(["a", "b", "c"], use, "binpack") == [
        {"host": "a", "score": 8}, {"host": "b", "score": 2}, {"host": "c", "score": 0}]
    assert policy.node_scores(["a", "b"], use, "spread") == [
        {"host": "a", "score": 2}, {"host": "b", "score": 8}]


def test_unknown_policy_refused() -> None:
    with pytest.raises(ValueError, match="unknown node policy"):
        policy.node_scores(["a"], {}, "random")
