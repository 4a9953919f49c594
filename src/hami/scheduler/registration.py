"""Node health and handshake as pure decisions (HAMi v2.10, field cases B20, B25).

The device plugin writes ``hami.io/node-nvidia-register`` and answers the scheduler's
``hami.io/node-handshake`` = ``Requesting_<time>`` by re-registering. For each node and
each pass (node event or 15 s tick) :func:`check_node` says whether the node is healthy,
whether the handshake must be rewritten, and the allocatable GPU count to remember.
Parsing the device list and registering it is :meth:`hami.core.state.ClusterState.upsert_node`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hami.api import names
from hami.core.codec import decode_handshake, encode_handshake, is_handshake_requesting
from hami.core.quantity import QuantityError, parse_quantity

#: A ``Requesting_`` handshake younger than this is trusted; a ``Deleted_`` mark younger
#: than this keeps the node out (B20).
HANDSHAKE_COOLDOWN = timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """``healthy``: keep or (re)register the node's devices. ``handshake``: the value to
    write to ``hami.io/node-handshake`` (None: leave it). ``reported``: allocatable GPU
    count to remember for the next pass."""

    healthy: bool
    handshake: str | None
    reported: int
    reason: str = ""


def allocatable_gpus(node: Mapping[str, Any], resource: str = names.RESOURCE_COUNT) -> int:
    """The node's allocatable ``resource`` (``nvidia.com/gpu`` by default; 0 when absent
    or unreadable)."""
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    if raw is None:
        return 0
    try:
        return max(0, int(parse_quantity(str(raw))))
    except (QuantityError, ValueError, OverflowError):
        return 0


def _handshake(value: str | None, allocatable: int, now: datetime) -> tuple[bool, str | None, str]:
    if value is not None and is_handshake_requesting(value):
        stamp = decode_handshake(value).time
        if stamp is None or now - stamp < HANDSHAKE_COOLDOWN or allocatable > 0:
            return True, None, ""
        return False, None, "device plugin did not answer the handshake"
    if value is not None and value.startswith("Deleted"):
        stamp = decode_handshake(value).time
        if stamp is None:
            return False, None, "handshake marked Deleted with an unreadable time"
        if now - stamp < HANDSHAKE_COOLDOWN:
            return False, None, "handshake marked Deleted less than 60s ago"
    return True, encode_handshake(now), ""


def check_node(node: Mapping[str, Any], reported: int | None, now: datetime, *,
               handshake_key: str = names.NODE_HANDSHAKE,
               resource: str = names.RESOURCE_COUNT) -> NodeHealth:
    """HAMi's ``CheckHealth`` for one node and one vendor (HAMi v2.10 step 2): NVIDIA by
    default; another vendor passes its handshake annotation (``hami.io/node-handshake-dcu``,
    ...) and its count resource (``hygon.com/dcunum``, ...), the generic rule is the same.

    ``now`` is the scheduler's naive local wall clock (the handshake's time base).
    A ``Deleted_<time>`` handshake (older HAMi cleanup, B20) keeps the node out for the
    cooldown, then the handshake is rewritten to ``Requesting_<now>`` so the node can
    come back; an unreadable ``Deleted_`` time stays out.
    """
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    current = allocatable_gpus(node, resource)
    healthy, handshake, reason = _handshake(annotations.get(handshake_key), current, now)
    last = reported or 0
    if current == 0 and last > 0:
        return NodeHealth(False, handshake, 0, f"allocatable {resource} dropped to 0")
    return NodeHealth(healthy, handshake, current, reason)
