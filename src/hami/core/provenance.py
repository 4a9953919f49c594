"""Where an allocation comes from: only hami's scheduler may write one.

The device plugin serves, and the scheduler charges, what a pod's allocation
annotations say (``hami.io/vgpu-devices-to-allocate``, ``-allocated``, ``hami.io/vgpu-node``,
``hami.io/bind-phase`` ..., HAMi's keys, and every registered vendor's). A pod creator
must not be able to write them: the webhook removes them from every Pod CREATE it sees
(:func:`strip_allocation`), whatever the pod's scheduler; the chart's admission policy
refuses later changes by anyone but hami's service accounts.

Pure functions over pod dicts; the key set comes from the config's vendor registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hami.api import names
from hami.core.config import SchedulerConfig

#: HAMi's NVIDIA allocation annotations and the scheduler's bookkeeping on the pod.
NVIDIA_KEYS = (names.VGPU_NODE, names.VGPU_TIME, names.DEVICES_TO_ALLOCATE,
               names.DEVICES_ALLOCATED, names.MIG_ALLOCATIONS, names.BIND_PHASE,
               names.BIND_TIME)
#: Labels only the scheduler writes.
LABEL_KEYS = (names.VGPU_NODE,)


def allocation_keys(config: SchedulerConfig) -> frozenset[str]:
    """Every pod annotation key that carries an allocation or its progress: HAMi's NVIDIA
    keys and each registered vendor's allocated / to-allocate keys."""
    keys = set(NVIDIA_KEYS)
    for vendor in config.vendors().values():
        keys.add(vendor.allocated_key)
        if vendor.to_allocate_key:
            keys.add(vendor.to_allocate_key)
    return frozenset(keys)


def strip_allocation(pod: Mapping[str, Any], config: SchedulerConfig
                     ) -> tuple[Mapping[str, Any], tuple[str, ...]]:
    """The pod without allocation annotations and labels, and what was removed
    (``"annotation <key>"`` / ``"label <key>"``, sorted). The pod itself is not changed;
    when nothing is removed it is returned as is. Malformed metadata (not an object) is
    left for admission to judge.
    """
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return pod, ()
    removed: list[str] = []
    new_meta = dict(meta)
    for field, keys in (("annotations", allocation_keys(config)), ("labels", LABEL_KEYS)):
        values = meta.get(field)
        if not isinstance(values, Mapping):
            continue
        hits = sorted(k for k in values if k in keys)
        if hits:
            new_meta[field] = {k: v for k, v in values.items() if k not in keys}
            removed += [f"{field[:-1]} {k}" for k in hits]
    if not removed:
        return pod, ()
    return {**pod, "metadata": new_meta}, tuple(sorted(removed))
