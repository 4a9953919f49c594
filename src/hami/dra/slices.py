"""One ResourceSlice per node from the registered GPUs (DRA mode). Pure.

The input is the same per-GPU record that feeds the ``hami.io/node-nvidia-register``
annotation (:func:`hami.deviceplugin.register.node_devices`), so both modes advertise the
same cards with the same scaling. Each card becomes one device of the slice
(``resource.k8s.io/v1``, Kubernetes v1.37) that kube-scheduler may split across claims
(``allowMultipleAllocations``, consumable capacity, KEP-5075):

* capacity ``memory``: bytes (registered MiB x 2^20, ``deviceMemoryScaling`` applied);
  a request without a ``memory`` entry gets the whole card; requests round up to MiB.
* capacity ``cores``: percent of the card's compute (0-100 x ``deviceCoreScaling``);
  default 0 (HAMi's meaning: no compute reservation unless asked).
* capacity ``shares``: the split count; every claim consumes exactly 1.
* attributes ``uuid``, ``type`` (HAMi's device type, e.g. ``NVIDIA-A100``),
  ``productName``, ``numa``, ``index``.
* health: an unhealthy card keeps its device, with a ``NoSchedule`` taint
  ``gpu.hami.io/unhealthy`` (new claims avoid it, running pods keep it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami.core.model import DeviceInfo
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity

#: The DRA driver name (a DNS subdomain), also the DeviceClass name of the chart.
DRIVER = "gpu.hami.io"
#: The taint key of an unhealthy card.
UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
#: The capacity names (qualified by the driver when used in a CEL selector).
MEMORY, CORES, SHARES = "memory", "cores", "shares"
MIB = 2**20
#: Upstream limit on devices per slice (ResourceSliceMaxDevicesWithAdvancedFeatures:
#: taints and consumable capacity count as advanced features).
MAX_DEVICES_PER_SLICE = 64


class SliceError(ValueError):
    """The node's cards cannot be published as one slice (too many devices)."""


def device_name(index: int) -> str:
    """The device name of the card with NVML index ``index``: ``gpu-<index>`` (a DNS label)."""
    return f"gpu-{index}"


def slice_name(node: str) -> str:
    """The ResourceSlice name of ``node`` (one slice per node): ``<node>-gpu.hami.io``."""
    return f"{node}-{DRIVER}"


def product_name(device_type: str) -> str:
    """``productName`` attribute: the type without HAMi's ``NVIDIA-`` prefix, else as is."""
    return device_type.removeprefix("NVIDIA-") or device_type


def slice_device(d: DeviceInfo, cordoned: bool = False) -> dict[str, Any]:
    """The ``spec.devices[]`` entry of one card (module docstring). ``cordoned``: an
    operator cordoned the card (taint like an unhealthy one)."""
    memory_bytes = max(d.memory_mib, 0) * MIB
    cores = max(d.cores_percent, 0)
    shares = max(d.split_count, 1)
    device: dict[str, Any] = {
        "name": device_name(d.index),
        "allowMultipleAllocations": True,
        "attributes": {
            "uuid": {"string": d.uuid},
            "type": {"string": d.type},
            "productName": {"string": product_name(d.type)},
            "numa": {"int": d.numa},
            "index": {"int": d.index},
        },
        "capacity": {
            MEMORY: {"value": str(memory_bytes), "requestPolicy": {
                "default": str(memory_bytes),
                "validRange": {"min": str(MIB), "max": str(memory_bytes), "step": str(MIB)}}},
            CORES: {"value": str(cores), "requestPolicy": {
                "default": "0", "validRange": {"min": "0", "max": str(cores), "step": "1"}}},
            SHARES: {"value": str(shares), "requestPolicy": {
                "default": "1", "validValues": ["1"]}},
        },
    }
    if not d.health or cordoned:
        reason = "unhealthy" if not d.health else "cordoned"
        device["taints"] = [{"key": UNHEALTHY_TAINT, "value": reason, "effect": "NoSchedule"}]
    return device


def resource_slice(node: str, devices: Sequence[DeviceInfo], *, generation: int = 1,
                   cordoned: frozenset[str] = frozenset(),
                   owner: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The node's ResourceSlice (a ``resource.k8s.io/v1`` object as a dict).

    ``devices``: the registered cards in index order (MIG-mode cards are not published:
    DRA mode covers HAMi-core sharing only). ``generation``: the pool generation (bump it
    on every change so the scheduler drops older slices). ``cordoned``: UUIDs an operator
    cordoned. ``owner``: the Node's ``{"name", "uid"}`` so the slice goes with the Node.

    Raises:
        SliceError: more than :data:`MAX_DEVICES_PER_SLICE` cards.
    """
    cards = [d for d in devices if d.mode != "mig"]
    if len(cards) > MAX_DEVICES_PER_SLICE:
        raise SliceError(f"node {node} has {len(cards)} GPUs; one ResourceSlice holds at "
                         f"most {MAX_DEVICES_PER_SLICE}")
    meta: dict[str, Any] = {"name": slice_name(node)}
    if owner and owner.get("uid"):
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": owner["name"],
                                    "uid": owner["uid"], "controller": True}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [slice_device(d, d.uuid in cordoned) for d in cards],
        },
    }


def slice_changed(current: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    """True when the stored slice's devices or driver differ from ``wanted`` (ignoring
    the generation, metadata and any defaults the apiserver added to taints)."""
    if current is None:
        return True
    cur, want = current.get("spec") or {}, wanted["spec"]
    return bool(cur.get("driver") != want["driver"] or cur.get("nodeName") != want["nodeName"]
                or _norm(cur.get("devices")) != _norm(want["devices"]))


def _norm(devices: Any) -> Any:
    if not isinstance(devices, list):
        return devices
    out = []
    for dev in devices:
        if isinstance(dev, Mapping):
            dev = dict(dev)
            dev["taints"] = [{k: t.get(k) for k in ("key", "value", "effect")}
                             for t in dev.get("taints") or [] if isinstance(t, Mapping)]
            dev["capacity"] = {k: _norm_cap(v) for k, v in (dev.get("capacity") or {}).items()}
        out.append(dev)
    return out


def _norm_cap(cap: Any) -> Any:
    """Quantities come back canonicalised (``1Mi`` for 1048576): compare their bytes."""
    def q(v: Any) -> Any:
        try:
            return to_int_exact(quantity(v))
        except (QuantityError, ValueError, TypeError):
            return v

    if not isinstance(cap, Mapping):
        return cap
    pol = cap.get("requestPolicy") or {}
    rng = pol.get("validRange") or {}
    return (q(cap.get("value")), q(pol.get("default")),
            tuple(q(v) for v in pol.get("validValues") or ()),
            tuple(q(rng.get(k)) for k in ("min", "max", "step")))
