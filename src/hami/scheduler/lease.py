"""Leader election on a ``coordination.k8s.io/v1`` Lease, as pure decisions.

The loop in :mod:`hami.scheduler.election` reads the Lease every retry period and asks
:func:`lease_step` what to write; the write carries the read ``resourceVersion`` (create
when absent), so two replicas never both win. Semantics follow client-go's
``leaderelection``: a lease is free when ``renewTime + leaseDurationSeconds`` has passed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any


@dataclass(frozen=True, slots=True)
class LeaseStep:
    """``spec`` to write (None: nothing, we are follower) and whether we lead after it."""

    spec: dict[str, Any] | None
    leader: bool
    holder: str = ""


def micro_time(now: datetime) -> str:
    """Kubernetes MicroTime: ``2026-01-02T03:04:05.123456Z``."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str | None) -> datetime | None:
    """Parse a MicroTime/Time string; None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def lease_step(spec: Mapping[str, Any] | None, identity: str, now: datetime,
               duration: timedelta) -> LeaseStep:
    """Decide the next write for ``identity`` given the Lease ``spec`` just read (None when
    the Lease does not exist)."""
    seconds = max(1, int(duration.total_seconds()))
    mine = {"holderIdentity": identity, "leaseDurationSeconds": seconds,
            "renewTime": micro_time(now)}
    if spec is None:
        return LeaseStep({**mine, "acquireTime": micro_time(now), "leaseTransitions": 0},
                         True, identity)
    holder = spec.get("holderIdentity") or ""
    if holder == identity:
        return LeaseStep({**dict(spec), **mine}, True, identity)
    renewed = parse_micro_time(spec.get("renewTime"))
    held_for = timedelta(seconds=int(spec.get("leaseDurationSeconds") or seconds))
    if holder and renewed is not None and now < renewed + held_for:
        return LeaseStep(None, False, holder)
    transitions = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
    return LeaseStep({**dict(spec), **mine, "acquireTime": micro_time(now),
                      "leaseTransitions": transitions}, True, identity)


def release_spec(spec: Mapping[str, Any], identity: str, now: datetime) -> dict[str, Any] | None:
    """On clean shutdown: a spec that frees the lease at once (None when not ours)."""
    if spec.get("holderIdentity") != identity:
        return None
    return {**dict(spec), "holderIdentity": None, "leaseDurationSeconds": 1,
            "renewTime": micro_time(now)}


def follows_as_leader(spec: Mapping[str, Any] | None, hostname: str, now: datetime) -> bool:
    """HAMi's rule (HAMi v2.10) for a process that does not elect itself: it leads iff the
    kube-scheduler Lease's holder identity starts with this host's name (kube-scheduler
    writes ``<hostname>_<uuid>``) and the lease has not expired. So the hami process in the
    same pod as the active kube-scheduler is the one that decides."""
    if not spec or not hostname:
        return False
    holder = spec.get("holderIdentity") or ""
    if not holder.startswith(hostname):
        return False
    renewed = parse_micro_time(spec.get("renewTime"))
    seconds = int(spec.get("leaseDurationSeconds") or 0)
    return renewed is not None and now < renewed + timedelta(seconds=seconds)
