"""Which pod an extender request is about: the scheduler's own view, never the body's.

kube-scheduler sends the whole Pod in ExtenderArgs, but anyone who reaches ``/filter``
could send any body: a forged spec under a real pod's name and UID (more memory than it
asked for), a pod of another namespace that is already running (to rewrite its
allocation), or UIDs of pods that do not exist (to leave charges in the ledger).
:class:`PendingPods` keeps the pods this scheduler may place, fed by the pod watch: not
bound, not finished, not being deleted, with ``spec.schedulerName`` equal to hami's.
``/filter`` resolves the body's UID against it (falling back to one GET when the watch is
behind) and decides on the cached object; ``/bind`` binds only a pod this replica has
filtered.

Pure bookkeeping plus one awaited read; the engine feeds it from its watch.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

JSON = dict[str, Any]
TERMINAL = ("Succeeded", "Failed")


class UnknownPod(Exception):
    """The request names a pod this scheduler may not place; the message says why."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


class PendingPods:
    """Pods of ``scheduler_name`` waiting for a node, by UID, and the UIDs filtered here.

    ``filtered`` remembers, per UID, the monotonic time of this replica's last ``/filter``
    answer that gave the pod a node (charged or passed through); entries older than
    ``filtered_ttl_s`` (default 10 minutes) are dropped when the map is swept, so pods
    that never come back to ``/bind`` cost nothing for long.
    """

    def __init__(self, scheduler_name: str, *, filtered_ttl_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.scheduler_name = scheduler_name
        self.filtered_ttl_s = filtered_ttl_s
        self._clock = clock
        self._pods: dict[str, JSON] = {}
        self._filtered: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._pods)

    # ------------------------------------------------------------------ watch
    def schedulable(self, pod: Mapping[str, Any]) -> bool:
        """The pod waits for hami to place it: our schedulerName, no node, not finished
        and not being deleted."""
        spec = pod.get("spec")
        status = pod.get("status")
        if not isinstance(spec, Mapping):
            spec = {}
        if not isinstance(status, Mapping):
            status = {}
        return (bool(self.scheduler_name) and spec.get("schedulerName") == self.scheduler_name
                and not spec.get("nodeName") and status.get("phase") not in TERMINAL
                and not _meta(pod).get("deletionTimestamp"))

    def apply(self, pod: Mapping[str, Any], deleted: bool) -> None:
        """A pod watch event (or a listed pod)."""
        uid = str(_meta(pod).get("uid") or "")
        if not uid:
            return
        if not deleted and self.schedulable(pod):
            self._pods[uid] = dict(pod)
            return
        self._pods.pop(uid, None)
        if deleted:
            self._filtered.pop(uid, None)

    def forget_unlisted(self, listed_uids: Iterable[str]) -> None:
        """After a relist: pods that were not listed are gone."""
        keep = set(listed_uids)
        for uid in [u for u in self._pods if u not in keep]:
            del self._pods[uid]

    # ---------------------------------------------------------------- filter
    async def resolve(self, body_pod: Mapping[str, Any],
                      get_pod: Callable[[str, str], Awaitable[JSON | None]]) -> JSON:
        """The pod the scheduler decides on for an ExtenderArgs ``Pod``: the cached (or,
        when the watch has not delivered it yet, freshly read) object with the same
        namespace, name and UID; the body's spec, annotations and status are never used.

        Raises:
            UnknownPod: no UID in the body, no such pod, a different UID (recreated or
                forged), or a pod this scheduler may not place (bound, finished, being
                deleted, or of another scheduler).
            hami.kube.KubeError: the read failed (the caller answers with the error).
        """
        meta = _meta(body_pod)
        uid = str(meta.get("uid") or "")
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        who = f"pod {namespace}/{name}"
        if not uid:
            raise UnknownPod(f"{who}: the extender request carries no pod UID")
        pod = self._pods.get(uid)
        if pod is not None and (_meta(pod).get("namespace") or "default", _meta(pod).get("name")) \
                == (namespace, name):
            return pod
        live = await get_pod(namespace, name)
        if live is None or _meta(live).get("uid") != uid:
            raise UnknownPod(f"{who} with UID {uid} does not exist")
        if not self.schedulable(live):
            raise UnknownPod(f"{who} is not waiting for scheduler {self.scheduler_name!r} "
                             "(bound, finished, being deleted or of another scheduler)")
        self._pods[uid] = live
        return live

    # ------------------------------------------------------------------ bind
    def filtered(self, uid: str) -> None:
        """This replica answered ``/filter`` for ``uid`` with a node."""
        self._sweep()
        self._filtered[uid] = self._clock()

    def was_filtered(self, uid: str) -> bool:
        """``uid`` got a node from this replica's ``/filter`` within the TTL."""
        at = self._filtered.get(uid)
        return at is not None and self._clock() - at <= self.filtered_ttl_s

    def bound(self, uid: str) -> None:
        """The pod is bound: nothing more to remember."""
        self._filtered.pop(uid, None)
        self._pods.pop(uid, None)

    def _sweep(self) -> None:
        now = self._clock()
        if len(self._filtered) < 1024:
            return
        for uid in [u for u, at in self._filtered.items() if now - at > self.filtered_ttl_s]:
            del self._filtered[uid]
