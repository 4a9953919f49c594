"""The simulator charges a GPU sidecar (restartable init container) as ``hami schedule``
does, through the same core (issue 25 item 1): the ledger keeps it beside the app
container, so a neighbour that would fit beside the app container alone is not placed."""

from __future__ import annotations

from typing import Any

from hami.core.codec import encode_node_devices
from hami.core.request import pod_request
from hami.devices.registry import make_config
from hami.offline import schedule
from hami.sim.replay import FRAGMENTATION_AWARE, Replayer, workload_distribution
from hami.sim.trace import TraceNode, TracePod

CARD_MIB = 16384


def gpu(name: str, mib: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "x", **extra,
            "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mib}}}


def pods() -> list[dict[str, Any]]:
    side = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "side", "namespace": "a"},
            "spec": {"initContainers": [gpu("s", 6000, restartPolicy="Always")],
                     "containers": [gpu("c", 6000)]}}
    late = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late", "namespace": "b"},
            "spec": {"containers": [gpu("c", 6000)]}}
    return [side, late]


def test_simulator_and_offline_schedule_agree_on_a_sidecar() -> None:
    node = TraceNode("n", 64000, 262144, 1, "A10")
    replayer = Replayer([node], FRAGMENTATION_AWARE,
                        workload_distribution([TracePod("x", 1000, 1024, 1, 500)]),
                        gpu_memory={"A10": CARD_MIB})
    config = make_config()
    placed = [replayer.schedule(pod_request(p, config.registry))[0] for p in pods()]
    assert placed == ["n", None]
    ((info, slots, mib, _),) = replayer.ledger.device_usage("n")
    assert (slots, mib) == (2, 12000)
    node_obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "annotations": {
        "hami.io/node-nvidia-register": encode_node_devices([info])}}}
    offline = schedule([node_obj, *pods()], config)
    assert [p["node"] for p in offline["pods"]] == ["n", None]
    assert offline["pods"][0]["annotations"]["hami.io/vgpu-devices-allocated"] == \
        f"{info.uuid},NVIDIA,6000,0:;{info.uuid},NVIDIA,6000,0:;"
