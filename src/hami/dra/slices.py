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

Cards in MIG mode are published as partitionable devices instead
(:mod:`hami.dra.migslices`), which can take more than one slice per node
(:func:`resource_slices`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami.core.model import DeviceInfo
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity
from hami.dra import migslices

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


def _slice(node: str, name: str, generation: int, count: int,
           owner: Mapping[str, str] | None, **content: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
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
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            **content,
        },
    }


def empty_slice(node: str, name: str, *, generation: int, count: int,
                owner: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A slice ``name`` of the node's pool with no devices (one no longer needed)."""
    return _slice(node, name, generation, count, owner, devices=[])


def resource_slices(node: str, devices: Sequence[DeviceInfo], *, generation: int = 1,
                    cordoned: frozenset[str] = frozenset(),
                    owner: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The node's pool: its ResourceSlices (``resource.k8s.io/v1`` objects as dicts).

    ``devices``: the registered cards in index order. Cards in ``mig`` mode are published
    as partitionable devices (:mod:`hami.dra.migslices`), the others as one shareable
    device each (:func:`slice_device`). The first slice is ``<node>-gpu.hami.io`` with the
    first :data:`MAX_DEVICES_PER_SLICE` devices; MIG instances beyond that go to
    ``<node>-gpu.hami.io-mig-<k>`` (k from 1), and the MIG cards' counter sets to
    ``<node>-gpu.hami.io-counters-<k>`` (k from 0; a slice holds devices or counters,
    never both). A node without MIG cards has exactly one slice, :func:`resource_slice`.
    ``generation``: the pool generation, the same in every slice (bump it on every
    change so the scheduler drops older slices). ``cordoned``: UUIDs an operator
    cordoned. ``owner``: the Node's ``{"name", "uid"}`` so the slices go with the Node.

    Raises:
        SliceError: more than :data:`MAX_DEVICES_PER_SLICE` shareable cards.
    """
    cards = [d for d in devices if d.mode != "mig"]
    if len(cards) > MAX_DEVICES_PER_SLICE:
        raise SliceError(f"node {node} has {len(cards)} GPUs; one ResourceSlice holds at "
                         f"most {MAX_DEVICES_PER_SLICE}")
    mig = [d for d in devices if d.mode == "mig" and d.mig_profiles]
    all_devices = [slice_device(d, d.uuid in cordoned) for d in cards]
    all_devices += [dev for d in mig for dev in migslices.instance_devices(d, d.uuid in cordoned)]
    per, sets = MAX_DEVICES_PER_SLICE, migslices.MAX_COUNTER_SETS_PER_SLICE
    device_chunks = [all_devices[i:i + per] for i in range(0, len(all_devices), per)] or [[]]
    counter_chunks = [[migslices.counter_set(d) for d in mig[i:i + sets]]
                      for i in range(0, len(mig), sets)]
    count = len(device_chunks) + len(counter_chunks)
    base = slice_name(node)
    out = [_slice(node, base if k == 0 else f"{base}-mig-{k}", generation, count, owner,
                  devices=chunk) for k, chunk in enumerate(device_chunks)]
    out += [_slice(node, f"{base}-counters-{k}", generation, count, owner, sharedCounters=chunk)
            for k, chunk in enumerate(counter_chunks)]
    return out


def resource_slice(node: str, devices: Sequence[DeviceInfo], *, generation: int = 1,
                   cordoned: frozenset[str] = frozenset(),
                   owner: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The node's first ResourceSlice ``<node>-gpu.hami.io`` (:func:`resource_slices`;
    the only one when no card is in MIG mode). Raises :class:`SliceError`."""
    return resource_slices(node, devices, generation=generation, cordoned=cordoned,
                           owner=owner)[0]


def slice_changed(current: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    """True when the stored slice's devices or driver differ from ``wanted`` (ignoring
    the generation, metadata and any defaults the apiserver added to taints)."""
    if current is None:
        return True
    cur, want = current.get("spec") or {}, wanted["spec"]
    return bool(cur.get("driver") != want["driver"] or cur.get("nodeName") != want["nodeName"]
                or (cur.get("pool") or {}).get("resourceSliceCount")
                != want["pool"]["resourceSliceCount"]
                or _norm(cur.get("devices")) != _norm(want.get("devices"))
                or _norm_counters(cur.get("sharedCounters")) != _norm_counters(
                    want.get("sharedCounters")))


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
            dev["consumesCounters"] = _norm_counters(
                [{"name": c.get("counterSet"), "counters": c.get("counters")}
                 for c in dev.get("consumesCounters") or [] if isinstance(c, Mapping)])
        out.append(dev)
    return out


def _norm_counters(sets: Any) -> Any:
    """Counter sets as ``{name: {counter: bytes}}`` (quantities canonicalised)."""
    if not isinstance(sets, list):
        return sets or []
    return sorted((str(cs.get("name")), sorted(
        (k, _q((v or {}).get("value") if isinstance(v, Mapping) else v))
        for k, v in (cs.get("counters") or {}).items()))
        for cs in sets if isinstance(cs, Mapping))


def _q(v: Any) -> Any:
    try:
        return to_int_exact(quantity(v))
    except (QuantityError, ValueError, TypeError):
        return v


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
