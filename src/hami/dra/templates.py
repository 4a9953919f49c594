"""DRA mode: create a translated pod's ResourceClaimTemplates once the pod exists.

The webhook writes nothing (a forged AdmissionReview must not make hami create objects):
it answers the patch and signs, on the pod, what its ``hami-gpu-<hash>`` templates must
hold (:mod:`hami.dra.signedspecs`). This reconciler sees every pod through the
scheduler's pod watch (:meth:`TemplateReconciler.observe`) and, for a pod not yet bound
that names a hami template its namespace lacks and that has no claim yet, creates the
template, only when the pod carries a valid signature for that namespace, the name is
the hash of a signed spec and the pod keeps the security rules the webhook applies to it
(:func:`hami.core.isolation.security_violations`; a pod created while the webhook was
down may carry a signature copied from an admitted pod). Otherwise nothing is created:
the reason is logged and recorded as a Warning Event on the pod
(``DraTemplateRefused``), once per pod and template: every replica posts it under the
same name (:func:`refusal_event_name`), so the API server keeps one whichever replica
leads, across relists, leader changes and restarts (annotations are mutable: a pod whose
signature annotation changes is looked at again, without another Event, so a tenant
rewriting it costs reads, no writes). kube-controller-manager's resourceclaim controller
retries a pod whose template is missing, so the claim follows within its backoff.

Idempotent: a create answered 409 reads the template back; a template of hami's name
that asks something else than the signed spec (a tenant made it first) is left alone and
reported, as the webhook refuses it at admission. Every replica reconciles (with keys
made per process, only the replica whose webhook signed can verify); creates race into
409s.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hami.core import isolation
from hami.dra import bounds, specshape
from hami.dra.claimusers import hami_template_containers
from hami.dra.signedspecs import (
    NAME_PREFIX,
    SIGNATURE_ANNOTATION,
    Keys,
    SignatureError,
    signed_templates,
)

if TYPE_CHECKING:
    from hami.core.config import SchedulerConfig
    from hami.dra.templategc import TemplateCollector

log = logging.getLogger(__name__)
JSON = dict[str, Any]
#: Warning Event reason on a pod whose template hami did not create.
REFUSED = "DraTemplateRefused"
#: How long a template seen or created is taken to exist without a GET (seconds).
KNOWN_TTL_S = 60.0
#: At most this many remembered templates / reported pods (oldest dropped first).
MAX_REMEMBERED = 20000

__all__ = ["KNOWN_TTL_S", "REFUSED", "TemplateReconciler", "missing_templates",
           "refusal_event_name"]


def missing_templates(pod: Mapping[str, Any]) -> list[str]:
    """The hami template names (``hami-gpu-`` prefix) of the pod's
    ``spec.resourceClaims`` whose claim the pod's status does not name yet; [] for a pod
    that is bound, being deleted, finished or malformed. Pure; never raises."""
    try:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        status = pod.get("status") or {}
        entries = spec.get("resourceClaims")
        if (not isinstance(entries, list) or not entries or spec.get("nodeName")
                or meta.get("deletionTimestamp")
                or status.get("phase") in ("Succeeded", "Failed")):
            return []
        made = {str(s.get("name")) for s in status.get("resourceClaimStatuses") or []
                if isinstance(s, Mapping) and s.get("resourceClaimName")}
        out = []
        for entry in entries:
            if not isinstance(entry, Mapping):
                continue
            name = entry.get("resourceClaimTemplateName")
            if (isinstance(name, str) and name.startswith(NAME_PREFIX)
                    and entry.get("name") not in made and name not in out):
                out.append(name)
        return out
    except (AttributeError, TypeError):
        return []


def _signature(meta: Mapping[str, Any]) -> str:
    """A digest of the pod's signature annotation (tenant text of up to 256 KiB is not
    kept)."""
    annotations = meta.get("annotations")
    value = annotations.get(SIGNATURE_ANNOTATION) if isinstance(annotations, Mapping) else None
    return hashlib.sha256(value.encode()).hexdigest() if isinstance(value, str) else ""


class TemplateReconciler:
    """``client``: lightkube ``AsyncClient``; ``keys``: the webhook's key ring;
    ``emit(pod metadata, reason, message)``: records a Warning Event (None: logs only);
    ``config``: the scheduler's device config, so that the containers using hami's
    templates keep the rules of GPU containers (reserved env names, mounts over the
    library, the priority-0 grant) as at the webhook; None checks only the rules for
    every container of a GPU pod.
    """

    def __init__(self, client: Any, keys: Keys,
                 emit: Callable[[Mapping[str, Any], str, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 config: SchedulerConfig | None = None) -> None:
        self.client = client
        self.config = config
        self.keys = keys
        self.emit = emit
        self.clock = clock
        #: (namespace, name) -> when the template was last seen or created.
        self._known: dict[tuple[str, str], float] = {}
        #: pod UID -> {template name refused: digest of the pod's signature annotation
        #: then} (one Event each; the pod is looked at again only when that changes).
        self._reported: dict[str, dict[str, str]] = {}
        self._inflight: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        #: The collector of unused templates that runs next to it (stopped with it).
        self.collector: TemplateCollector | None = None
        #: Templates created by this reconciler, and refusals (for metrics and tests).
        self.created = 0
        self.refused = 0

    def observe(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """One pod from the watch (any event, relists too): start :meth:`reconcile` in the
        background when the pod names a hami template not known to exist. Cheap for the
        rest; never raises."""
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        if not isinstance(meta, Mapping):
            return
        uid = str(meta.get("uid") or "")
        if deleted:
            self._reported.pop(uid, None)
            return
        wanted = missing_templates(pod)
        namespace = str(meta.get("namespace") or "default")
        now = self.clock()
        signature, reported = _signature(meta), self._reported.get(uid) or {}
        if not wanted or uid in self._inflight or all(
                now - self._known.get((namespace, n), -KNOWN_TTL_S) < KNOWN_TTL_S
                or reported.get(n) == signature for n in wanted):
            return
        self._inflight.add(uid)
        task = asyncio.get_running_loop().create_task(self._run(uid, pod),
                                                      name=f"dra-templates-{uid}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, uid: str, pod: Mapping[str, Any]) -> None:
        try:
            await self.reconcile(pod)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an API error: the next event or relist retries
            meta = pod.get("metadata") or {}
            log.warning("ResourceClaimTemplates of pod %s/%s not reconciled: %s",
                        meta.get("namespace"), meta.get("name"), exc)
        finally:
            self._inflight.discard(uid)

    async def _stop_collector(self) -> None:
        if self.collector is not None:
            await self.collector.stop()

    def forget(self, namespace: str, name: str) -> None:
        """The template ``namespace/name`` was deleted: the next pod naming it is
        reconciled at once (not taken to exist for :data:`KNOWN_TTL_S`)."""
        self._known.pop((namespace, name), None)

    async def stop(self) -> None:
        """Cancel the reconciles in flight (and stop :attr:`collector`)."""
        await self._stop_collector()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def reconcile(self, pod: Mapping[str, Any]) -> dict[str, str]:
        """Make the pod's missing hami templates exist where its signature allows:
        template name -> ``"created"``, ``"exists"`` or ``"refused: <why>"``.

        Raises:
            lightkube.ApiError: reading or creating a template failed otherwise than
                404 (read) or 409 (create).
        """
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        out: dict[str, str] = {}
        signed, why = self._verify(namespace, meta)
        problems = isolation.security_violations(pod, self.config,
                                                 hami_template_containers(pod))
        if problems:  # the webhook refuses these; it did not see this pod
            signed, why = None, ("the pod breaks the rules for GPU pods (created while the "
                                 "webhook was down?): " + isolation.message(problems))
        wanted = missing_templates(pod)
        too_many = bounds.claims_denial(pod)
        if too_many and wanted:  # no read per name: one Event, every name remembered
            out[wanted[0]] = self._refuse(meta, namespace, wanted[0], too_many)
            signature = _signature(meta)
            self._reported.setdefault(str(meta.get("uid") or ""), {}).update(
                dict.fromkeys(wanted, signature))
            return dict.fromkeys(wanted, out[wanted[0]])
        for name in wanted:
            ours = (signed or {}).get(name)
            existing = await self._get(namespace, name)
            if existing is None:
                if ours is None:
                    out[name] = self._refuse(meta, namespace, name, why or (
                        f"the pod's signed specs do not include {name}"))
                    continue
                existing = await self._create(namespace, ours)
                if existing is None:
                    out[name] = "created"
                    continue
            if ours is not None and not specshape.same_template_spec(
                    ours["spec"], existing.get("spec") or {}):
                out[name] = self._refuse(
                    meta, namespace, name, "a template of this name exists and asks for "
                    "something else than hami's; hami names its templates after what they "
                    "ask, so it was not made by hami: delete it and the pod")
                continue
            self._known[(namespace, name)] = self.clock()
            out[name] = "exists"
        self._trim()
        return out

    def _verify(self, namespace: str, meta: Mapping[str, Any]
                ) -> tuple[dict[str, JSON] | None, str]:
        annotations = meta.get("annotations")
        try:
            return signed_templates(self.keys.verifying_keys(), namespace,
                                    annotations if isinstance(annotations, Mapping) else {}), ""
        except SignatureError as exc:
            return None, str(exc)

    def _refuse(self, meta: Mapping[str, Any], namespace: str, name: str, why: str) -> str:
        self.refused += 1
        message = f"ResourceClaimTemplate {namespace}/{name} not created: {why}"
        reported = self._reported.setdefault(str(meta.get("uid") or ""), {})
        signature = _signature(meta)
        if name in reported:
            if reported[name] != signature:
                reported[name] = signature
                log.debug("pod %s/%s: %s", namespace, meta.get("name"), message)
        else:
            reported[name] = signature
            log.warning("pod %s/%s: %s", namespace, meta.get("name"), message)
            if self.emit is not None:
                self.emit(meta, REFUSED, message)
        return f"refused: {why}"

    async def _get(self, namespace: str, name: str) -> JSON | None:
        return await read_template(self.client, namespace, name)

    async def _create(self, namespace: str, template: Mapping[str, Any]) -> JSON | None:
        """Create ``template`` in ``namespace``: None when created, the template there
        when another replica or reconcile made it first (409)."""
        from lightkube import ApiError, codecs

        doc = {**template, "metadata": {**template["metadata"], "namespace": namespace}}
        try:
            await self.client.create(codecs.from_dict(doc), namespace=namespace)
            self.created += 1
            self._known[(namespace, str(template["metadata"]["name"]))] = self.clock()
            return None
        except ApiError as exc:
            if exc.status.code != 409:
                raise
        existing = await self._get(namespace, str(template["metadata"]["name"]))
        return existing if existing is not None else dict(template)

    def _trim(self) -> None:
        while len(self._known) > MAX_REMEMBERED:
            del self._known[next(iter(self._known))]
        while len(self._reported) > MAX_REMEMBERED:
            del self._reported[next(iter(self._reported))]


def refusal_event_name(pod_meta: Mapping[str, Any], reason: str, message: str) -> str:
    """The Event name for a refusal about a pod: ``<pod name>.<digest of the pod's UID,
    the reason and the message>``, the same on every replica and after a restart (so
    the API server keeps one Event per refusal). Pure."""
    digest = hashlib.sha256("\0".join(
        (str(pod_meta.get("uid") or ""), reason, message)).encode()).hexdigest()[:16]
    return f"{str(pod_meta.get('name') or '')[:200]}.{digest}"


async def read_template(client: Any, namespace: str, name: str) -> JSON | None:
    """The ResourceClaimTemplate ``namespace/name`` (resource.k8s.io/v1) as a dict, None
    when there is none. ``client`` is a lightkube ``AsyncClient``. Raises lightkube's
    ``ApiError`` for other API errors."""
    from lightkube.resources.resource_v1 import ResourceClaimTemplate

    return await _read(client, ResourceClaimTemplate, namespace, name)


async def read_claim(client: Any, namespace: str, name: str) -> JSON | None:
    """The ResourceClaim ``namespace/name`` (resource.k8s.io/v1), as :func:`read_template`."""
    from lightkube.resources.resource_v1 import ResourceClaim

    return await _read(client, ResourceClaim, namespace, name)


async def _read(client: Any, resource: Any, namespace: str, name: str) -> JSON | None:
    from lightkube import ApiError

    try:
        obj = await client.get(resource, name, namespace=namespace)
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise
    doc: JSON = obj.to_dict()
    return doc
