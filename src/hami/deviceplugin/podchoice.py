"""Which pod an Allocate or GetPreferredAllocation serves (HAMi-core 1.2). Pure.

Deliberate decision beyond HAMi v2.10 (docs: the concurrency test):

* **Which pod.** HAMi takes the node-lock owner, else the first pending pod in
  bind-phase allocating/success. Kubelet requests carry no pod identity, so when two pods
  wait for Allocate on the node at once HAMi can hand one pod's limits to the other. The
  device IDs do not tell them apart either: kubelet takes them from our own
  GetPreferredAllocation answer, which had to guess the pod the same way. Here the pod is
  served only when it is the one pod that can be meant: the only pod of the node waiting
  for devices (lock owner or pending pod), or the only one whose next entries have the
  requested device counts. Otherwise Allocate fails without touching any pod (kubelet
  rejects the pod it was admitting; the other one is served on its own Allocate). A pod
  with nothing left to allocate, or not pending on this node, is never chosen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hami.deviceplugin.podview import (
    BIND_PHASE,
    BIND_TIME,
    VGPU_NODE,
    AllocateError,
    PodView,
    decode_entries,
    pending_entries,
    physical_uuid,
)
from hami.deviceplugin.preferred import PreferredRequest, preferred_rank

# --- the node lock (HAMi v2.10) -------------------------------------------------------------


def lock_owner(value: str | None) -> tuple[str, str] | None:
    """``(namespace, name)`` named by a ``hami.io/mutex.lock`` value; None when absent,
    legacy (time only) or malformed (HAMi v2.10)."""
    if not value or "," not in value:
        return None
    parts = value.split(",")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


def lock_releasable(value: str | None, namespace: str, name: str) -> bool:
    """True when this pod may remove the node lock: it names the pod, or it is legacy."""
    if not value:
        return False
    if "," not in value:
        return True
    return value.endswith(f",{namespace},{name}")


# --- the pods that wait ----------------------------------------------------------------------


def is_candidate(pod: PodView, node: str) -> bool:
    """HAMi's pending-pod test (HAMi-core 1.2 step 2) plus "something is left to allocate"."""
    a = pod.annotations
    return (pod.phase == "Pending" and BIND_TIME in a
            and a.get(BIND_PHASE) in ("allocating", "success")
            and a.get(VGPU_NODE) == node and bool(pending_entries(pod)))


def _bind_time(pod: PodView) -> int:
    try:
        return int(pod.annotations.get(BIND_TIME, ""))
    except ValueError:
        return 2**62


def waits_here(pod: PodView, node: str) -> bool:
    """The lock owner may be the pod kubelet is admitting: it is ``Pending`` on ``node``
    (``spec.nodeName``: kubelet only admits pods bound to it) and has devices left."""
    return pod.phase == "Pending" and pod.node_name == node and bool(pending_entries(pod))


def _waiting_pool(owner: PodView | None, candidates: Sequence[PodView],
                  node: str) -> dict[tuple[str, str], PodView]:
    """The owner (when :func:`waits_here`) and every :func:`is_candidate`, by
    ``(namespace, name)``, the owner first."""
    pool: dict[tuple[str, str], PodView] = {}
    if owner is not None and waits_here(owner, node):
        pool[(owner.namespace, owner.name)] = owner
    for p in candidates:
        if is_candidate(p, node):
            pool.setdefault((p.namespace, p.name), p)
    return pool


# --- Allocate -----------------------------------------------------------------------------------


def match_rank(pod: PodView, requests: Sequence[Sequence[str]],
               replicas: Mapping[str, str] | None = None) -> int:
    """How well the pod's next entries fit the kubelet's container requests.

    2 = every request's IDs are replicas of exactly the annotated GPUs; 1 = device counts
    match; 0 = no fit (or MIG/empty requests, which carry no information).
    """
    try:
        entries = [c for c in decode_entries(pod) if c]
    except AllocateError:
        return 0
    if len(entries) < len(requests) or not requests:
        return 0
    exact = True
    for ids, entry in zip(requests, entries, strict=False):
        if len(ids) != len(entry):
            return 0
        if {physical_uuid(i, replicas) for i in ids} != {d.uuid for d in entry}:
            exact = False
    return 2 if exact else 1


def choose_pod(requests: Sequence[Sequence[str]], owner: PodView | None,
               candidates: Sequence[PodView], node: str,
               replicas: Mapping[str, str] | None = None) -> PodView | None:
    """The pod this Allocate serves (see module docstring), or None when no pod waits.

    ``owner`` is the lock owner (if any), ``candidates`` the pods bound to ``node``. The
    pool is the owner (when :func:`waits_here`) and every :func:`is_candidate`; its only
    pod is served (a count mismatch then fails that pod, as in HAMi), else its only pod
    whose next entries have the requested device counts (:func:`match_rank` > 0).

    Raises:
        AllocateError: several pods could be meant (none of them is to be marked failed:
            the kubelet fails the one it was admitting).
    """
    pool = _waiting_pool(owner, candidates, node)
    if len(pool) <= 1:
        return next(iter(pool.values()), None)
    fits = [p for p in pool.values() if match_rank(p, requests, replicas) > 0]
    if len(fits) == 1:
        return fits[0]
    waiting = ", ".join(f"{ns}/{name}" for ns, name in sorted(pool))
    raise AllocateError(
        f"cannot tell which pod this Allocate is for: {waiting} all wait for devices on "
        f"node {node} and {'fit' if fits else 'none fits'} the request "
        f"{[len(ids) for ids in requests]} device(s); refusing rather than serving one "
        f"pod another pod's devices")


# --- GetPreferredAllocation ---------------------------------------------------------------------


def choose_preferred_pod(requests: Sequence[PreferredRequest], owner: PodView | None,
                         candidates: Sequence[PodView], node: str,
                         replicas: Mapping[str, str] | None = None) -> PodView | None:
    """The pod whose GPUs GetPreferredAllocation prefers: like :func:`choose_pod`'s pool,
    best :func:`~hami.deviceplugin.preferred.preferred_rank` first, then the lock owner,
    then older bind-time. Only a preference: Allocate still refuses when several pods
    could be meant."""
    pool = _waiting_pool(owner, candidates, node)
    if not pool:
        return None
    owner_key = (owner.namespace, owner.name) if owner is not None else None
    return min(pool.values(), key=lambda p: (
        -preferred_rank(p, requests, replicas),
        0 if (p.namespace, p.name) == owner_key else 1, _bind_time(p), p.namespace, p.name))
