"""``/webhook`` in DRA mode (``hami scheduler --dra-mode``): the shell around
:func:`hami.dra.translate.translate`.

For a Pod CREATE that asks for NVIDIA GPUs and names no claims: refuse what the normal
webhook refuses for isolation (host PID, privileged, ...), translate, and answer with the
JSON Patch, which also puts on the pod the specs of its ResourceClaimTemplates, signed
(:mod:`hami.dra.signedspecs`). The webhook writes nothing (a forged AdmissionReview gets
an answer, no object): the scheduler's template reconciler creates the templates once
the pod exists (:mod:`hami.dra.templates`). A template of hami's name that exists
already must ask exactly what hami would write (the name is a hash of the spec; one a
tenant made under that name is refused by name). A
namespace with a GPU memory or cores ResourceQuota is checked against the claims already
there for hami's DeviceClass or driver, ours or the tenant's own (ResourceQuota itself
counts only devices): an allocated claim books what it consumes (a MIG instance: its
published memory and cores share; a device no published slice holds: the largest card,
named in the denial), one not allocated yet
what it asks, a whole card booking the largest published card's memory
(:mod:`hami.dra.booking`; what the check reads: :mod:`hami.dra.quotaview`). Percentages
are accepted when every published card has one size.

A pod that names ResourceClaims or ResourceClaimTemplates itself is not translated, but
in a namespace with a GPU quota it is checked against the quota with what those claims
and templates ask of hami's DeviceClass (:func:`hami.dra.booking.admission_asks`: read
strictly unless of the exact shape hami writes;
a named claim already counted in the total adds only what the total does not hold of it),
and refused when a named object cannot be found, read or counted; a hami template not
made yet counts what the pod's signed specs say (none signed: refused). ResourceClaims and
ResourceClaimTemplates themselves are checked when created (:mod:`hami.dra.claimquota`).
Every other request
(pods without GPUs, other operations) goes to the normal webhook. Whichever it is, a GPU
pod passes the isolation rules and loses any hand-written allocation annotations, as
with the normal webhook.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import jsonpatch

from hami.core import isolation
from hami.core.config import SchedulerConfig
from hami.core.provenance import strip_allocation
from hami.core.quota import QuotaLedger
from hami.devices import nvidia
from hami.dra import (
    bounds,
    claimquota,
    claimusers,
    namedclaims,
    podclaims,
    signedspecs,
    specshape,
)
from hami.dra import translate as tr
from hami.dra.booking import claim_booking
from hami.dra.quotaview import QuotaView
from hami.dra.reservations import QuotaReservations
from hami.dra.templates import read_claim, read_template

#: The objects one AdmissionReview has read, by (kind, namespace, name): the quota check
#: and the GPU-container rules read a pod's named claims and templates once between them.
_REVIEW_READS: contextvars.ContextVar[dict[tuple[str, str, str], JSON | None] | None] = (
    contextvars.ContextVar("hami_dra_review_reads", default=None))
log = logging.getLogger(__name__)
JSON = dict[str, Any]
__all__ = ["MAX_ANNOTATIONS_BYTES", "DraWebhook", "claim_booking", "route"]
#: The API server's limit on a pod's annotations (keys and values, bytes).
MAX_ANNOTATIONS_BYTES = 256 * 1024


def _reply(api_version: str, uid: str, allowed: bool, message: str = "",
           patch: list[JSON] | None = None, code: int = 403) -> JSON:
    resp: JSON = {"uid": uid, "allowed": allowed}
    if not allowed:
        resp["status"] = {"code": code, "message": message, "reason": "Forbidden",
                          "status": "Failure"}
    elif message:
        resp["status"] = {"code": 200, "message": message}
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": resp}


class DraWebhook(QuotaView):
    """Callable for the ``/webhook`` route; what it reads of the cluster (the published
    cards, a namespace's quota ledger) is its :class:`hami.dra.quotaview.QuotaView` part.
    ``client``: lightkube ``AsyncClient``; ``fallback``: the normal webhook (body -> reply) for requests DRA mode leaves to it;
    ``quota``: the scheduler's namespace quota ledger (limits only are used); ``keys``:
    the key ring that signs the templates' specs on the pod (default: this process's
    key, :func:`hami.dra.signedspecs.process_keys`); the template reconciler must verify
    with the same keys. ``deadline_s``: the most one review's API reads may take;
    ``reservations``: where admitted ResourceClaims are reserved against the namespace
    quota across replicas (None: each claim is checked against the listed claims only,
    so claims created in the same instant can overrun the quota); ``trusted_creators``:
    the users whose claim CREATEs for a pod are the resourceclaim controller's
    (:mod:`hami.dra.podclaims`: those claims book as their pod)."""

    def __init__(self, client: Any, config: SchedulerConfig, fallback: Callable[[bytes], JSON],
                 quota: QuotaLedger | None = None, uniform_memory_mib: int | None = None,
                 keys: signedspecs.Keys | None = None,
                 deadline_s: float = bounds.REVIEW_DEADLINE_S,
                 reservations: QuotaReservations | None = None,
                 trusted_creators: Sequence[str] = podclaims.TRUSTED_CREATORS) -> None:
        super().__init__(client, config, quota, reservations)
        self.trusted_creators = tuple(trusted_creators)
        self.deadline_s = deadline_s
        self.keys = keys if keys is not None else signedspecs.process_keys()
        self.fallback = fallback
        self.uniform_memory_mib = uniform_memory_mib

    async def _read(self, kind: str, namespace: str, name: str) -> JSON | None:
        """A ResourceClaimTemplate or ResourceClaim (``kind``) as a dict, None when absent
        (:data:`hami.dra.claimusers.Reader`); read once per review (:data:`_REVIEW_READS`).
        Raises lightkube's ``ApiError`` for other API errors (not remembered)."""
        reads = _REVIEW_READS.get()
        key = (kind, namespace, name)
        if reads is not None and key in reads:
            return reads[key]
        obj = await (read_template(self.client, namespace, name)
                     if kind == "ResourceClaimTemplate"
                     else read_claim(self.client, namespace, name))
        if reads is not None:
            reads[key] = obj
        return obj

    async def _template(self, namespace: str, name: str) -> JSON | None:
        """The ResourceClaimTemplate ``namespace/name`` as a dict, None when there is none
        (once per review). Raises lightkube's ``ApiError`` for other API errors."""
        return await self._read("ResourceClaimTemplate", namespace, name)

    async def _conflict(self, namespace: str, template: JSON) -> str | None:
        """The denial when a template of ``template``'s name exists in ``namespace`` and
        asks for something else (a tenant may pre-create one under the name hami derives
        from a request, asking more), else None. Reads only: the template itself is made
        once the pod exists (:mod:`hami.dra.templates`)."""
        name = str(template["metadata"]["name"])
        existing = await self._template(namespace, name)
        if existing is None or specshape.same_template_spec(template["spec"],
                                                          existing.get("spec") or {}):
            return None
        return (f"ResourceClaimTemplate {namespace}/{name} has the name of hami's template "
                "for this GPU request but asks for something else; hami names its templates "
                "after what they ask, so this one was not made by hami: delete it and create "
                "the pod again")

    def _signed(self, pod: Mapping[str, Any], namespace: str) -> tuple[dict[str, JSON], str]:
        """The hami templates the pod carries signed for ``namespace``
        (:func:`hami.dra.signedspecs.signed_templates`) and "", or {} and why not."""
        meta = pod.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        try:
            return signedspecs.signed_templates(
                self.keys.verifying_keys(), namespace,
                annotations if isinstance(annotations, Mapping) else {}), ""
        except signedspecs.SignatureError as exc:
            return {}, str(exc)

    async def _claim_review(self, request: Mapping[str, Any], api_version: str,
                            uid: str) -> JSON:
        """The reply to a ResourceClaim or ResourceClaimTemplate request
        (:mod:`hami.dra.claimquota`); refused when the API cannot be read (fail closed)."""
        from lightkube import ApiError

        try:
            denial = await claimquota.denial(self, request)
        except ApiError as exc:
            denial = ("cannot check the claim against the namespace's GPU quota: "
                      f"{exc.status.code} {exc.status.message}")
        return _reply(api_version, uid, denial is None, denial or "")

    async def __call__(self, body: bytes) -> JSON:
        """The AdmissionReview reply (never raises on bad input: 400/403 replies). The
        review's API reads end within ``deadline_s`` seconds, or it is refused (fail
        closed, before the API server's own webhook timeout)."""
        ids: dict[str, str] = {}
        token = _REVIEW_READS.set({})
        try:
            async with asyncio.timeout(self.deadline_s):
                return await self._answer(body, ids)
        except TimeoutError:
            log.warning("DRA admission review %s past its deadline (%g s): refused",
                        ids.get("uid"), self.deadline_s)
            return _reply(ids.get("api_version", "admission.k8s.io/v1"), ids.get("uid", ""),
                          False, f"hami's GPU checks of this request did not finish within "
                          f"{self.deadline_s:g} s (the API server answers slowly); try again")
        finally:
            _REVIEW_READS.reset(token)

    async def _answer(self, body: bytes, ids: dict[str, str]) -> JSON:
        """:meth:`__call__` without the deadline; fills ``ids`` (``uid``,
        ``api_version``) as soon as the review is parsed."""
        try:
            doc = json.loads(body)
            request = doc["request"]
            api_version = str(doc.get("apiVersion") or "admission.k8s.io/v1")
            uid = str(request.get("uid") or "")
            ids.update(uid=uid, api_version=api_version)
            if claimquota.handles(request):
                return await self._claim_review(request, api_version, uid)
            pod = request["object"]
            creates_pod = ((request.get("kind") or {}).get("kind") in (None, "Pod")
                           and not request.get("subResource")
                           and request.get("operation") in (None, "", "CREATE"))
            if not isinstance(pod, dict):
                raise TypeError("request.object is not an object")
            spec = pod.get("spec")
            namespace = str((pod.get("metadata") or {}).get("namespace")
                            or request.get("namespace") or "default")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return self.fallback(body)
        if not creates_pod:
            problems = _debug_violations(request, pod)
            return (_reply(api_version, uid, False, isolation.message(problems)) if problems
                    else self.fallback(body))
        if isinstance(spec, dict) and spec.get("resourceClaims"):
            # before any read, whatever the namespace's quota: the entries below are
            # read (claimusers, namedclaims), and their count is the tenant's
            denial = bounds.claims_denial(pod) or await namedclaims.denial(self, pod, namespace)
            if denial:
                return _reply(api_version, uid, False, denial)
        # A pod naming hami's template, or a claim or template of hami's DeviceClass the
        # tenant made, gets a GPU without asking for one by name: the containers using
        # such a claim keep the rules of GPU containers.
        using = (await claimusers.hami_claim_containers(pod, namespace, self._read)
                 if isinstance(spec, dict) and spec.get("resourceClaims") else None)
        claim_problems = ([] if using is None
                          else isolation.security_violations(pod, self.config, using))
        if claim_problems:
            return _reply(api_version, uid, False, isolation.message(claim_problems))
        if not isolation.asks_for_devices(pod, self.config):
            return self.fallback(body)
        # As the normal webhook: no hand-written allocation survives creation (a
        # translated pod gets hami's schedulerName, whose scheduler charges them).
        clean, removed = strip_allocation(pod, self.config)
        note = (f"removed {', '.join(removed)} (only hami's scheduler writes them)"
                if removed else "")
        try:
            problems = isolation.violations(clean, self.config)
            if problems:
                return _reply(api_version, uid, False, isolation.message(problems))
            if tr.uses_claims(clean):
                return _reply(api_version, uid, True,
                              "; ".join(filter(None, ["pod uses ResourceClaims: left alone",
                                                      note])),
                              patch=jsonpatch.make_patch(pod, dict(clean)).patch)
            uniform, largest = self.uniform_memory_mib, self.uniform_memory_mib or 0
            sizes, offers = await self.published()
            if sizes:
                largest = max(sizes)
                if uniform is None and len(sizes) == 1:
                    uniform = largest
            ledger = await self.namespace_ledger(namespace, largest)
            result = tr.translate(
                clean, nvidia.settings(self.config), quota=ledger, uniform_memory_mib=uniform,
                whole_card_mib=largest, mig_offers=offers,
                scheduler_name=self.config.scheduler_name,
                overwrite_default_scheduler=self.config.force_overwrite_default_scheduler)
        except tr.TranslateError as exc:
            return _reply(api_version, uid, False, str(exc))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            return _reply(api_version, uid, False, f"malformed pod: {exc}", code=400)
        if result is None:
            return self.fallback(body)
        too_many = bounds.claims_denial(result.pod, "the pod as hami translates it")
        if too_many:
            return _reply(api_version, uid, False, too_many)
        for template in result.templates.values():
            denial = await self._conflict(namespace, template)
            if denial:
                return _reply(api_version, uid, False, denial)
        meta = result.pod.setdefault("metadata", {})
        if not isinstance(meta.get("annotations"), dict):
            meta["annotations"] = {}
        meta["annotations"].update(
            signedspecs.sign(self.keys.signing_key(), namespace, result.templates))
        size = sum(len(str(k).encode()) + len(str(v).encode())
                   for k, v in meta["annotations"].items())
        if size > MAX_ANNOTATIONS_BYTES:
            return _reply(api_version, uid, False,
                          f"the pod's annotations with hami's {signedspecs.SPECS_ANNOTATION} "
                          f"would take {size} bytes, over the API's {MAX_ANNOTATIONS_BYTES}: "
                          "ask for fewer GPU containers or fewer type/UUID values")
        patch = jsonpatch.make_patch(pod, result.pod).patch
        return _reply(api_version, uid, True, note, patch=patch)


def _debug_violations(request: Mapping[str, Any], pod: Mapping[str, Any]) -> list[str]:
    """For ``pods/ephemeralcontainers`` of a pod naming hami's template (its GPU
    resources moved into a claim, so the normal webhook sees no GPU pod): what the
    added ephemeral containers break (:func:`hami.core.isolation.ephemeral_violations`).
    [] for every other request; never raises."""
    if (request.get("subResource") != "ephemeralcontainers"
            or signedspecs.template_containers(pod) is None):
        return []
    old = request.get("oldObject")
    old_spec = old.get("spec") if isinstance(old, Mapping) else None
    old_list = old_spec.get("ephemeralContainers") if isinstance(old_spec, Mapping) else None
    existing = {c.get("name") for c in old_list or [] if isinstance(c, Mapping)}
    added = (pod.get("spec") or {}).get("ephemeralContainers")
    return [p for c in (added if isinstance(added, list) else [])
            if isinstance(c, Mapping) and c.get("name") not in existing
            for p in isolation.ephemeral_violations(c)]


def route(webhook: DraWebhook) -> Callable[[bytes], Awaitable[JSON]]:
    """The handler the scheduler's ``/webhook`` route calls in DRA mode."""
    return webhook.__call__
