"""The node-lock protocol as pure decisions (HAMi v2.10, field cases B01, B02).

``hami.io/mutex.lock`` on a Node = ``<RFC3339>,<namespace>,<pod>``. Given the current value
(or None), the clock and who is asking, :func:`lock_step` says what the caller must do;
:func:`release_step` does the same for a release. The GET/PATCH (with the node's
resourceVersion as compare-and-swap) live in :mod:`hami.kube` and
:mod:`hami.scheduler.binder`.

Unlike HAMi, an expired lock is not taken from an owner that still waits for the device
plugin's Allocate (:func:`owner_awaits_allocate`): the lock is what keeps a second pod off
the node until the first one has its devices, and the plugin cannot tell two pods of one
GPU apart. Such a lock is kept at most :func:`max_lock_age` (``MAX_AGE_FACTOR`` lock
timeouts), so an owner stuck in ``allocating`` cannot block a node for ever. Locks that
name no owner (legacy values, vendors' time-only locks) expire as in HAMi: there is nobody
to ask.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from hami.api import names
from hami.core.codec import CodecError, NodeLock, decode_node_lock

CONTENTION = "node lock contention"

#: An expired lock whose owner still waits for Allocate is kept until it is this many
#: lock timeouts old (30 minutes with the default ``--node-lock-timeout=5m``).
MAX_AGE_FACTOR = 6


class LockAction(Enum):
    """What to do with the lock value just read."""

    SET = "set"  #: no lock: write ours (CAS on the read resourceVersion)
    HELD = "held"  #: already ours (re-entrant): nothing to write
    TAKE_OVER = "take-over"  #: expired: overwrite with ours (CAS)
    CHECK_OWNER = "check-owner"  #: look up the owner pod; gone or terminal => take over
    #: expired, but its owner may still wait for Allocate: look it up;
    #: :func:`owner_awaits_allocate` => contention, else take over
    CHECK_WAITING = "check-waiting"
    CONTENDED = "contended"  #: someone else holds it: wait or fail with contention
    MALFORMED = "malformed"  #: unparsable value: error, never taken over (HAMi)


@dataclass(frozen=True, slots=True)
class LockStep:
    """A decision and the parsed lock it was made on (None when absent/unparsable)."""

    action: LockAction
    lock: NodeLock | None = None
    reason: str = ""


def max_lock_age(timeout: timedelta) -> timedelta:
    """Age past which a lock is taken over even from an owner still waiting for Allocate
    (``MAX_AGE_FACTOR`` x ``timeout``, the ``--node-lock-timeout``)."""
    return timeout * MAX_AGE_FACTOR


def lock_step(value: str | None, now: datetime, timeout: timedelta,
              namespace: str, name: str) -> LockStep:
    """Decide how ``namespace/name`` may acquire a node lock whose value is ``value``.

    ``timeout`` is ``--node-lock-timeout``. A lock older than that is taken over at once
    when it names no owner (legacy or incomplete value), names the caller, or is older
    than :func:`max_lock_age`; otherwise its owner has to be looked up
    (:attr:`LockAction.CHECK_WAITING`). Never raises.
    """
    if value is None or value == "":
        return LockStep(LockAction.SET)
    try:
        lock = decode_node_lock(value)
    except CodecError as exc:
        return LockStep(LockAction.MALFORMED, None, f"invalid node lock {value!r}: {exc}")
    ownerless = not (lock.namespace and lock.name)
    age = now - lock.time
    if age > timeout:
        if ownerless or lock.is_owned_by(namespace, name):
            return LockStep(LockAction.TAKE_OVER, lock, "expired")
        if age > max_lock_age(timeout):
            return LockStep(LockAction.TAKE_OVER, lock, "expired past the maximum age")
        return LockStep(LockAction.CHECK_WAITING, lock, "expired")
    if lock.is_owned_by(namespace, name):
        return LockStep(LockAction.HELD, lock)
    if ownerless:
        return LockStep(LockAction.CONTENDED, lock, "legacy lock without owner")
    return LockStep(LockAction.CHECK_OWNER, lock)


def owner_is_dangling(owner_pod: dict | None) -> bool:  # type: ignore[type-arg]
    """The lock owner named in a lock is gone (GET NotFound: None) or terminal (B02 variant:
    a Failed/Succeeded pod never runs device-plugin Allocate, so it never releases)."""
    if owner_pod is None:
        return True
    phase = (owner_pod.get("status") or {}).get("phase")
    return phase in ("Failed", "Succeeded")


def owner_awaits_allocate(owner_pod: dict | None, node: str) -> bool:  # type: ignore[type-arg]
    """True when the owner of an expired lock on ``node`` may still get its Allocate, so
    the lock must not be taken from it.

    ``owner_pod`` is the owner as read from the API (None: NotFound). It waits when it
    exists, is still ``Pending`` (a pod that started running passed admission, so its
    Allocate is done; Succeeded/Failed never run it), is on ``node`` (``spec.nodeName``,
    or ``hami.io/vgpu-node`` while the Binding is not written yet) and has
    ``hami.io/bind-phase: allocating`` (``success``/``failed`` are written by the device
    plugin once it served or refused the pod). Never raises on odd values.
    """
    if not isinstance(owner_pod, dict):
        return False
    status = owner_pod.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    if phase not in (None, "", "Pending"):
        return False
    meta = owner_pod.get("metadata")
    ann = meta.get("annotations") if isinstance(meta, dict) else None
    ann = ann if isinstance(ann, dict) else {}
    spec = owner_pod.get("spec")
    on = (spec.get("nodeName") if isinstance(spec, dict) else None) or ann.get(names.VGPU_NODE)
    return on == node and ann.get(names.BIND_PHASE) == "allocating"


def release_step(value: str | None, namespace: str, name: str, *, force: bool = False) -> bool:
    """True when releasing on behalf of ``namespace/name`` must remove ``value``.

    Only the exact owner releases (B01: never a substring match); ``force`` releases any
    lock. An unparsable value is never removed unless forced; a legacy lock (no owner)
    is removed only when forced.
    """
    if not value:
        return False
    if force:
        return True
    try:
        lock = decode_node_lock(value)
    except CodecError:
        return False
    return lock.is_owned_by(namespace, name)


def contention_message(node: str, timeout: timedelta) -> str:
    """HAMi's message for a lock held by someone else (HAMi v2.10)."""
    return f"node {node} has been locked within {_go_duration(timeout)}: {CONTENTION}"


def waiting_message(node: str, lock: NodeLock, timeout: timedelta) -> str:
    """Contention on an expired lock whose owner still waits for Allocate (ends with
    ``node lock contention``, so binds retry it like any contention)."""
    return (f"node {node} is locked by {lock.namespace}/{lock.name}, which still waits for "
            f"the device plugin's Allocate (kept up to {_go_duration(max_lock_age(timeout))}):"
            f" {CONTENTION}")


def _go_duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def parse_go_duration(text: str) -> timedelta:
    """Parse a Go duration such as ``5m``, ``28s``, ``1h30m``, ``500ms``, ``0``.

    Raises:
        ValueError: not a duration.
    """
    import re

    text = text.strip()
    if text in ("0", ""):
        return timedelta(0)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9]+(?:\.[0-9]*)?)(ms|us|µs|ns|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {text!r}")
    return timedelta(seconds=sum(float(n) * units[u] for n, u in parts))
