"""DRA mode: delete the ResourceClaimTemplates hami made once no pod needs them.

hami's templates (``hami-gpu-<hash>``, label ``hami.io/dra-template=true``) are shared by
every pod of a namespace that asks the same, so no one pod owns one. A template is
needed only until the resourceclaim controller has made the claim of each pod naming it
(the claim is then the pod's, owned by it, and outlives the template). So the collector
follows the scheduler's pod watch (:meth:`TemplateCollector.observe`: a pod not bound,
not finished and not being deleted *uses* the hami templates whose claim its status does
not name yet, :func:`hami.dra.templates.missing_templates`) and, every
:data:`SWEEP_S`, lists hami's templates and deletes those no pod has used for
:data:`IDLE_S`.

Deleting one too early is safe by construction: a pod admitted a moment before the
sweep (not in the watch yet) names a template that is gone, and the reconciler makes it
again from the pod's signed specs once it sees the pod
(:class:`hami.dra.templates.TemplateReconciler`; :meth:`TemplateCollector.sweep` tells
it through ``forget``). The sweep runs only while ``ready()`` (the leader, pod watch
synced) and never before :data:`IDLE_S` after it became ready, so a replica that has not
seen every pod yet deletes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from hami.dra.templates import missing_templates
from hami.dra.translate import TEMPLATE_LABEL

log = logging.getLogger(__name__)
__all__ = ["IDLE_S", "SWEEP_S", "TemplateCollector"]

#: A template no pod has used for this long (seconds) is deleted.
IDLE_S = 120.0
#: Seconds between sweeps.
SWEEP_S = 30.0


class TemplateCollector:
    """``client``: lightkube ``AsyncClient``; ``ready()``: True while this replica may
    delete (the leader, its pod watch synced); ``forget(namespace, name)``: called for
    each deleted template (the reconciler's cache of existing templates); ``clock``:
    monotonic seconds."""

    def __init__(self, client: Any, ready: Callable[[], bool],
                 forget: Callable[[str, str], None] | None = None,
                 idle_s: float = IDLE_S, sweep_s: float = SWEEP_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.ready = ready
        self.forget = forget
        self.idle_s = idle_s
        self.sweep_s = sweep_s
        self.clock = clock
        #: pod UID -> the (namespace, template) it uses
        self._uses: dict[str, set[tuple[str, str]]] = {}
        #: (namespace, template) -> how many pods use it
        self._users: dict[tuple[str, str], int] = {}
        #: (namespace, template) -> when its last user stopped using it
        self._released: dict[tuple[str, str], float] = {}
        self._ready_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        #: Templates deleted (for metrics and tests).
        self.deleted = 0

    def observe(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """One pod from the watch (any event, relists too). Never raises."""
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        if not isinstance(meta, Mapping) or not meta.get("uid"):
            return
        uid, namespace = str(meta["uid"]), str(meta.get("namespace") or "default")
        now = set() if deleted else {(namespace, n) for n in missing_templates(pod)}
        before = self._uses.get(uid, set())
        for key in now - before:
            self._users[key] = self._users.get(key, 0) + 1
            self._released.pop(key, None)
        for key in before - now:
            left = self._users.get(key, 1) - 1
            if left > 0:
                self._users[key] = left
            else:
                self._users.pop(key, None)
                self._released[key] = self.clock()
        if now:
            self._uses[uid] = now
        else:
            self._uses.pop(uid, None)

    def relisted(self, uids: set[Any]) -> None:
        """After a relist of pods (``uids``: those listed): the pods not listed were
        deleted while the watch was down and use nothing any more."""
        for uid in [u for u in self._uses if u not in uids]:
            self.observe({"metadata": {"uid": uid}}, deleted=True)

    def in_use(self, namespace: str, name: str) -> bool:
        """True while a watched pod still needs the template."""
        return (namespace, name) in self._users

    async def sweep(self) -> list[tuple[str, str]]:
        """Delete the idle hami templates (none unless ready for ``idle_s``): the
        ``(namespace, name)`` deleted.

        Raises:
            lightkube ``ApiError`` or ``httpx`` errors from the LIST or a delete (a
            delete answered 404, already gone, is skipped).
        """
        from lightkube import ApiError
        from lightkube.resources.resource_v1 import ResourceClaimTemplate

        now = self.clock()
        if not self.ready():
            self._ready_since = None
            return []
        if self._ready_since is None:
            self._ready_since = now
        if now - self._ready_since < self.idle_s:
            return []
        out = []
        async for template in self.client.list(ResourceClaimTemplate, namespace="*",
                                               labels={TEMPLATE_LABEL: "true"}):
            meta = template.metadata
            key = (str(meta.namespace), str(meta.name))
            if key in self._users or now - self._released.get(key, -1e18) < self.idle_s:
                continue
            try:
                await self.client.delete(ResourceClaimTemplate, key[1], namespace=key[0])
            except ApiError as exc:
                if exc.status.code != 404:
                    raise
                continue
            self._released.pop(key, None)
            self.deleted += 1
            if self.forget is not None:
                self.forget(*key)
            out.append(key)
        if out:
            log.info("deleted %d unused hami ResourceClaimTemplate(s)", len(out))
        return out

    def start(self) -> None:
        """Sweep every ``sweep_s`` in the background until :meth:`stop`."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                 name="dra-template-gc")

    async def stop(self) -> None:
        """Stop sweeping."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_s)
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an API error: the next sweep retries
                log.warning("unused hami ResourceClaimTemplates not collected: %s", exc)
