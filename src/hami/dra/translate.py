"""DRA mode admission: ``nvidia.com/gpu``/``gpumem``/``gpucores`` into a claim. Pure.

Users keep writing HAMi's resources. In DRA mode the webhook turns each GPU container's
request into a ResourceClaimTemplate (one per distinct request, shared by every pod
that asks the same, named by a hash of its spec) and a reference to it in the pod
(``spec.resourceClaims[]`` + the container's ``resources.claims[]``); the GPU resources
leave the container. The resourceclaim controller of kube-controller-manager then makes
one ResourceClaim per pod, owned by the pod (deleted with it), and kube-scheduler
allocates it from the slices (:mod:`hami.dra.slices`).

The claim request: ``count`` = ``nvidia.com/gpu`` (after HAMi's defaults and its
exclusive-card rule), capacity ``memory`` = ``gpumem`` MiB (none: the whole card),
``cores`` = ``gpucores``; CEL selectors for ``nvidia.com/use-gputype`` /
``nouse-gputype`` (case-insensitive substring, as HAMi) and ``use-gpuuuid`` /
``nouse-gpuuuid``; several cards get ``distinctAttribute: gpu.hami.io/uuid``.

MIG: when the cluster publishes MIG instance devices (``mig_profiles``, read by the
webhook from the watched slices) a one-GPU request with a memory amount becomes a
prioritized list (``firstAvailable``, GA in Kubernetes 1.36+): first the MIG profiles
whose instances hold that memory, smallest first (HAMi's extender mode also gives a
``gpumem`` request the smallest profile that fits), then the shared card as before. A
MIG subrequest asks for no ``cores`` (a MIG instance has its own compute; HAMi ignores
``gpucores`` for MIG too). Without published MIG devices, or for several GPUs or a whole
card, the request stays one ``exactly`` request.

Refused (403): ``gpumem-percentage`` below 100 unless every card of the class has one
size (``uniform_memory_mib``); a pod over its namespace's GPU memory/cores quota.
Left alone: pods that already use claims, pods that ask for no NVIDIA GPU.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hami.api import names
from hami.core.collapse import Role, effective_request, role_of
from hami.core.model import PERCENT_UNSET
from hami.core.podobjects import sidecar_positions
from hami.core.quota import QuotaLedger
from hami.core.request import RequestError
from hami.devices.nvidia import NvidiaConfig, container_request, mutate_container
from hami.dra.slices import DRIVER

#: The DeviceClass every translated request names (shipped with the chart).
DEVICE_CLASS = DRIVER
#: Label on the templates the webhook creates.
TEMPLATE_LABEL = "hami.io/dra-template"
#: The stand-in card a translated pod's bookings are collapsed on (its cards are not
#: chosen yet).
_POD_BOOKING = "dra-pod"
_SAFE = re.compile(r"^[A-Za-z0-9 ._:/+-]{1,128}$")
#: Subrequests of one ``firstAvailable`` list (the API's limit): MIG profiles + the card.
MAX_SUBREQUESTS = 8
#: The name of the shared-card subrequest in a prioritized list (``gpu/shared``).
SHARED_SUBREQUEST = "shared"
#: The longest CEL selector expression the API accepts (characters).
MAX_CEL_CHARS = 10 * 1024


class TranslateError(ValueError):
    """The pod cannot be translated; the message is the denial."""


@dataclass(frozen=True, slots=True)
class Translation:
    """``pod``: the mutated pod; ``templates``: template name -> ResourceClaimTemplate
    (dict, without namespace) to exist before the pod is created; ``memory_mib`` and
    ``cores_percent``: what the pod books for the namespace quota (HAMi's sum of app
    containers, max of init containers; sidecars added as Kubernetes adds them)."""

    pod: dict[str, Any]
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    memory_mib: int = 0
    cores_percent: int = 0


def uses_claims(pod: Mapping[str, Any]) -> bool:
    """True when the pod already names ResourceClaims (left alone in DRA mode)."""
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if isinstance(c, Mapping) and ((c.get("resources") or {}).get("claims")):
            return True
    return False


def _cel_list(values: tuple[str, ...], what: str) -> str:
    for v in values:
        if not _SAFE.match(v):
            raise TranslateError(f"{what} value {v!r} has characters other than letters, "
                                 "digits and ' ._:/+-'")
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def _csv(value: Any, lower: bool = False) -> tuple[str, ...]:
    if not isinstance(value, str):
        return ()
    return tuple(p.strip().lower() if lower else p.strip() for p in value.split(",") if p.strip())


def selectors(annotations: Mapping[str, Any]) -> list[dict[str, Any]]:
    """CEL selectors for the pod's type and UUID annotations (HAMi's matching rules).
    Raises :class:`TranslateError` on values that cannot go into CEL safely, or so many
    that the expression exceeds :data:`MAX_CEL_CHARS`."""
    attrs = f'device.attributes["{DRIVER}"]'
    out = []
    for key, neg, lower in ((names.USE_GPUTYPE, False, True),
                            (names.NOUSE_GPUTYPE, True, True),
                            (names.USE_GPUUUID, False, False),
                            (names.NOUSE_GPUUUID, True, False)):
        values = _csv(annotations.get(key), lower)
        if not values:
            continue
        lst = _cel_list(values, key)
        if lower:
            test = f"{lst}.exists(t, {attrs}.type.lowerAscii().contains(t))"
        else:
            test = f"{attrs}.uuid in {lst}"
        expression = f"!({test})" if neg else test
        if len(expression) > MAX_CEL_CHARS:
            raise TranslateError(f"{key}: {len(values)} values make a selector too long for "
                                 f"the API ({len(expression)} characters, at most "
                                 f"{MAX_CEL_CHARS}); name fewer")
        out.append({"cel": {"expression": expression}})
    return out


def mig_choices(offers: Iterable[tuple[str, int]], memory_mib: int) -> list[str]:
    """The MIG profiles to offer a request of ``memory_mib`` MiB, smallest first: of the
    published ``(profile, instance memory MiB)`` pairs those holding ``memory_mib``,
    each profile once (ranked by its smallest fitting instance, then by name), at most
    :data:`MAX_SUBREQUESTS` - 1 (the last place is the shared card's). Pure."""
    best: dict[str, int] = {}
    for profile, mib in offers:
        if mib >= memory_mib > 0 and _SAFE.match(profile):
            best[profile] = min(mib, best.get(profile, mib))
    ranked = sorted(best, key=lambda p: (best[p], p))
    return ranked[:MAX_SUBREQUESTS - 1]


def _subrequest_name(profile: str, taken: set[str]) -> str:
    label = re.sub(r"[^a-z0-9]+", "-", profile.lower()).strip("-")[:50] or "x"
    name, k = f"mig-{label}", 1
    while name in taken:
        k += 1
        name = f"mig-{label}-{k}"
    taken.add(name)
    return name


def mig_subrequest(profile: str, memory_mib: int, sel: list[dict[str, Any]],
                   name: str) -> dict[str, Any]:
    """The ``firstAvailable`` entry for one MIG instance of ``profile`` holding at least
    ``memory_mib`` MiB (CEL on the instance's ``profile`` attribute and ``memory``
    capacity), with the pod's type/UUID selectors ``sel``. No capacity request: a MIG
    instance device is allocated whole."""
    attrs = f'device.attributes["{DRIVER}"]'
    # guarded: a CEL error on a device without the attribute (a shared card) would fail
    # the pod's scheduling, not just skip the device
    test = (f'"profile" in {attrs} && {attrs}.profile == {json.dumps(profile)} && '
            f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{memory_mib}Mi")) >= 0')
    return {"name": name, "deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount",
            "count": 1, "selectors": [*sel, {"cel": {"expression": test}}]}


def claim_spec(nums: int, memory_mib: int, cores_percent: int,
               sel: list[dict[str, Any]], mig_profiles: Iterable[str] = ()) -> dict[str, Any]:
    """The ResourceClaim spec of one container: ``memory_mib`` 0 = the whole card.
    ``mig_profiles`` (:func:`mig_choices`, smallest first; used only for one card with a
    memory amount): the request becomes ``firstAvailable`` = those MIG profiles, then
    the shared card (subrequest :data:`SHARED_SUBREQUEST`)."""
    requests: dict[str, str] = {"cores": str(cores_percent)}
    if memory_mib:
        requests["memory"] = f"{memory_mib}Mi"
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount",
                               "count": nums, "capacity": {"requests": requests}}
    if sel:
        exactly["selectors"] = sel
    profiles = list(mig_profiles)[:MAX_SUBREQUESTS - 1] if nums == 1 and memory_mib else []
    if profiles:
        taken = {SHARED_SUBREQUEST}
        first = [mig_subrequest(p, memory_mib, sel, _subrequest_name(p, taken))
                 for p in profiles]
        first.append({"name": SHARED_SUBREQUEST, **exactly})
        return {"devices": {"requests": [{"name": "gpu", "firstAvailable": first}]}}
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    if nums > 1:
        spec["devices"]["constraints"] = [{"requests": ["gpu"],
                                           "distinctAttribute": f"{DRIVER}/uuid"}]
    return spec


def template_for(spec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(name, ResourceClaimTemplate)``: the name is ``hami-gpu-`` + 16 hex digits of the
    spec's SHA-256, so pods asking the same share one template."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    name = f"hami-gpu-{digest}"
    return name, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                  "metadata": {"name": name, "labels": {TEMPLATE_LABEL: "true"}},
                  "spec": {"spec": copy.deepcopy(dict(spec))}}


def translate(pod: Mapping[str, Any], config: NvidiaConfig, *,
              uniform_memory_mib: int | None = None,
              quota: QuotaLedger | None = None,
              whole_card_mib: int | None = None,
              mig_offers: Iterable[tuple[str, int]] = (),
              scheduler_name: str = "",
              overwrite_default_scheduler: bool = True) -> Translation | None:
    """The DRA form of ``pod``, or None when it is left alone (uses claims already, or
    asks for no NVIDIA GPU). A request for a whole card (no ``gpumem``) books
    ``whole_card_mib`` per card for the quota (the largest card it could get), else
    ``uniform_memory_mib``, else 0.

    ``scheduler_name`` (non-empty): the translated pod gets it as ``schedulerName`` when
    it names none, or names ``default-scheduler`` and ``overwrite_default_scheduler``
    (extender mode's rule), so the kube-scheduler profile that runs hami's prioritize
    verb places it; a pod naming another scheduler keeps it. Empty: unchanged.

    ``mig_offers``: the ``(profile, instance memory MiB)`` pairs of the published MIG
    instance devices (:func:`hami.dra.cache.mig_offers`); a one-card request with a
    memory amount some of them hold may get one (:func:`claim_spec`). The quota books
    the request's own memory and cores either way.

    Raises:
        TranslateError: a percentage request without one card size, a value CEL cannot
            carry, a malformed GPU value, or a namespace quota overrun.
    """
    if uses_claims(pod):
        return None
    mutated = copy.deepcopy(dict(pod))
    spec = mutated.get("spec") or {}
    annotations = (mutated.get("metadata") or {}).get("annotations") or {}
    n_init = len(spec.get("initContainers") or [])
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    sel = selectors(annotations)
    offers = list(mig_offers)
    templates: dict[str, dict[str, Any]] = {}
    claims: list[dict[str, str]] = []
    sidecars = sidecar_positions(mutated)
    booked: list[tuple[Role, int, int]] = []
    for pos, c in enumerate(containers):
        if not isinstance(c, dict):
            raise TranslateError("container is not an object")
        try:
            mutate_container(c, mutated, config)
            req = container_request(c, config)
        except RequestError as exc:
            raise TranslateError(str(exc)) from None
        if req is None:
            continue
        memory_mib = req.memory_mib
        if req.memory_percent not in (PERCENT_UNSET, 100):
            if not uniform_memory_mib:
                raise TranslateError(
                    f"{config.resource_memory_percentage_name} in container {c.get('name')}: "
                    "DRA mode cannot book a share of a card whose size it does not know "
                    "(the cards differ in size); ask for "
                    f"{config.resource_memory_name} in MiB instead")
            memory_mib = uniform_memory_mib * req.memory_percent // 100
        mig = mig_choices(offers, memory_mib) if req.nums == 1 else []
        name, template = template_for(claim_spec(req.nums, memory_mib, req.cores_percent, sel,
                                                 mig))
        templates[name] = template
        claim_ref = f"gpu-{pos}"
        claims.append({"name": claim_ref, "resourceClaimTemplateName": name})
        resources = c.setdefault("resources", {})
        for part in ("limits", "requests"):
            values = resources.get(part)
            if isinstance(values, dict):
                for key in [k for k in values if k.startswith("nvidia.com/")]:
                    del values[key]
        resources.setdefault("claims", []).append({"name": claim_ref})
        booked_mem = (memory_mib or whole_card_mib or uniform_memory_mib or 0) * req.nums
        booked.append((role_of(pos, n_init, sidecars), booked_mem, req.cores_percent * req.nums))
    if not claims:
        return None
    spec["resourceClaims"] = claims
    current = spec.get("schedulerName") or ""
    if scheduler_name and (not current or (current == names.DEFAULT_SCHEDULER
                                           and overwrite_default_scheduler)):
        spec["schedulerName"] = scheduler_name
    # max(app, init) as HAMi's pre-check, a sidecar added to the app containers and to
    # the init containers after it (Kubernetes' rule, KEP-753)
    mem, cores = effective_request(booked)
    namespace = str((mutated.get("metadata") or {}).get("namespace") or "default")
    if quota is not None and (mem or cores) and not quota.fits(namespace, mem, cores):
        raise TranslateError(f"exceeding resource quota: namespace {namespace} asks for {mem} "
                             f"MiB and {cores}% cores of GPU; {quota.describe(namespace)}")
    return Translation(mutated, templates, mem, cores)
