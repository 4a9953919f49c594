"""Where an allocation comes from: only hami's scheduler may write one.

The device plugin serves, and the scheduler charges, what a pod's allocation
annotations say (``hami.io/vgpu-devices-to-allocate``, ``-allocated``, ``hami.io/vgpu-node``,
``hami.io/bind-phase`` ..., HAMi's keys, and every registered vendor's). A pod creator
must not be able to write them: the webhook removes them from every Pod CREATE it sees
(:func:`strip_allocation`), whatever the pod's scheduler; the chart's admission policy
refuses later changes by anyone but hami's service accounts.

The scheduler also signs what it writes (:func:`sign`, an HMAC-SHA256 over the pod UID,
the node and the allocation annotations, RFC 2104) with a key it shares with the device
plugins, which serve an allocation only when :func:`verify` accepts it.

Pure functions over pod dicts; the key set comes from the config's vendor registry.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any

from hami.api import names
from hami.core.codec_mig import decode_mig_allocations
from hami.core.config import SchedulerConfig
from hami.core.gowire import CodecError

#: HAMi's NVIDIA allocation annotations, the scheduler's bookkeeping on the pod, and the
#: signature over them.
NVIDIA_KEYS = (names.VGPU_NODE, names.VGPU_TIME, names.DEVICES_TO_ALLOCATE,
               names.DEVICES_ALLOCATED, names.MIG_ALLOCATIONS, names.BIND_PHASE,
               names.BIND_TIME, names.ALLOCATION_SIGNATURE)
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


# ---------------------------------------------------------------- signatures
#: The scheduler's signature over a pod's allocation (not a HAMi key: HAMi components
#: ignore it; hami's device plugin requires it unless told to trust unsigned ones).
SIGNATURE = names.ALLOCATION_SIGNATURE
_VERSION = "v1"


class SignatureError(ValueError):
    """An allocation's signature is missing, malformed, by an unknown key, or wrong."""


def key_id(key: bytes) -> str:
    """A short public name of a key (first 8 hex digits of its SHA-256), so a verifier
    holding the current and the previous key knows which one to use."""
    return hashlib.sha256(key).hexdigest()[:8]


def split_signature(value: str, annotation: str) -> tuple[str, str]:
    """``(key id, hex MAC)`` of a ``v1:<key id>:<hex MAC>`` signature value (the form of
    every hami signature annotation). Raises :class:`SignatureError` naming
    ``annotation`` when the value is not of that form."""
    version, _, rest = value.partition(":")
    kid, _, mac = rest.partition(":")
    if version != _VERSION or not kid or not mac:
        raise SignatureError(f"malformed {annotation} annotation")
    return kid, mac


#: What a signature covers: the node and the NVIDIA grant the device plugin serves. The
#: to-allocate string lags it (:func:`check_to_allocate`); ``bind-phase``/``bind-time``
#: and the filter time are progress, not grant.
SIGNED_KEYS = (names.VGPU_NODE, names.DEVICES_ALLOCATED, names.MIG_ALLOCATIONS)


def _signed_message(uid: str, node: str, annotations: Mapping[str, str]) -> bytes:
    """The canonical bytes a signature covers: pod UID, node, and the :data:`SIGNED_KEYS`
    the pod carries. MIG reservations count by what the scheduler chose (GPU, profile,
    placement), not by the runtime identity the device plugin writes back later."""
    covered: dict[str, str] = {}
    for key in SIGNED_KEYS:
        if key not in annotations:
            continue
        value = annotations[key]
        if key == names.MIG_ALLOCATIONS:
            value = _mig_plan(value)
        covered[key] = value
    return json.dumps({"v": _VERSION, "uid": uid, "node": node, "annotations": covered},
                      sort_keys=True, separators=(",", ":")).encode()


def _mig_plan(value: str) -> str:
    try:
        plans = decode_mig_allocations(value)
    except CodecError:
        return value  # signed as written; a verifier then compares the raw text
    return json.dumps([[m.container_index, m.device_index, m.gpu_uuid, m.profile,
                        m.placement.start, m.placement.size] for m in plans])


def sign(key: bytes, uid: str, node: str, annotations: Mapping[str, str]) -> str:
    """``v1:<key id>:<HMAC-SHA256 hex>`` over :func:`_signed_message` (RFC 2104 HMAC)."""
    mac = hmac.new(key, _signed_message(uid, node, annotations), hashlib.sha256)
    return f"{_VERSION}:{key_id(key)}:{mac.hexdigest()}"


def verify(verifying_keys: Iterable[bytes], uid: str, node: str,
           annotations: Mapping[str, str]) -> None:
    """Check ``annotations[SIGNATURE]`` for this pod UID and node.

    ``verifying_keys`` are the keys currently accepted (the current one and, during a
    rotation, the previous one).

    Raises:
        SignatureError: no signature, a malformed one, a key id none of
            ``verifying_keys`` has, or a MAC that does not match (a changed allocation,
            another pod's or another node's signature).
    """
    value = annotations.get(SIGNATURE)
    if not value:
        raise SignatureError(f"no {SIGNATURE} annotation: the allocation was not written "
                             "by hami's scheduler")
    kid, mac = split_signature(value, SIGNATURE)
    message = _signed_message(uid, node, annotations)
    for key in verifying_keys:
        if key_id(key) != kid:
            continue
        expected = hmac.new(key, message, hashlib.sha256).hexdigest()
        if hmac.compare_digest(expected, mac):
            return
        raise SignatureError("the allocation does not match its signature (changed after "
                             "scheduling, or signed for another pod or node)")
    raise SignatureError(f"the allocation is signed by key {kid}, which is not accepted "
                         "(rotated out, or not hami's)")


def check_to_allocate(annotations: Mapping[str, str]) -> None:
    """The unsigned ``hami.io/vgpu-devices-to-allocate`` may only lag the signed
    ``-allocated`` string: every container entry still in it equals the entry at the same
    position of ``-allocated`` (the device plugin empties entries as it serves them).

    Raises:
        SignatureError: an entry differs, or there are more entries than containers
            allocated (a hand-edited to-allocate string).
    """
    pending = (annotations.get(names.DEVICES_TO_ALLOCATE) or "").split(";")
    granted = (annotations.get(names.DEVICES_ALLOCATED) or "").split(";")
    if len(pending) > len(granted):
        raise SignatureError(f"{names.DEVICES_TO_ALLOCATE} lists more containers than "
                             f"the signed {names.DEVICES_ALLOCATED}")
    for position, entry in enumerate(pending):
        if entry and entry != granted[position]:
            raise SignatureError(f"{names.DEVICES_TO_ALLOCATE} entry {position} differs "
                                 f"from the signed {names.DEVICES_ALLOCATED}")
