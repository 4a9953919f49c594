"""What a translated pod's ResourceClaimTemplates must hold, signed by the webhook. Pure.

In DRA mode admission has no side effect: the webhook answers the patch (the pod's
``spec.resourceClaims`` name ``hami-gpu-<hash>`` templates) and puts on the pod what
those templates must hold, ``hami.io/dra-claim-templates`` (the claim specs, a JSON
list), signed in ``hami.io/dra-claim-templates-signature``. The scheduler's template
reconciler (:mod:`hami.dra.templates`) creates a template once the pod exists, only
when the signature is valid for the pod's namespace and the template's name is the
hash of a signed spec (:func:`hami.dra.translate.template_for`). A pod created while
the webhook was down, or by a tenant copying a name, carries no valid signature: no
template is made for it.

The signature is an HMAC-SHA256 (RFC 2104) over a fixed prefix, the namespace and the
annotation's exact text, ``v1:<key id>:<hex>`` as allocation signatures
(:mod:`hami.core.provenance`), with the same keys: the allocation-signing key ring, or
with none configured a key made when the process starts (:func:`process_keys`; the
webhook and the reconciler are one process). A signature binds no pod name or UID:
neither exists when the webhook is asked (``generateName``; the UID is set after
admission); a copied pair, or one read from the answer to a forged AdmissionReview,
gets a pod of the same namespace a template of a spec hami's webhook makes (the pod
itself passes the webhook: quota and isolation rules).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from hami.core.provenance import SignatureError, key_id, split_signature
from hami.dra.translate import template_for

#: The claim specs of the pod's hami templates (JSON list, sorted by template name).
SPECS_ANNOTATION = "hami.io/dra-claim-templates"
#: ``v1:<key id>:<HMAC-SHA256 hex>`` over the namespace and :data:`SPECS_ANNOTATION`.
SIGNATURE_ANNOTATION = "hami.io/dra-claim-templates-signature"
#: The prefix of hami's template names (:func:`hami.dra.translate.template_for`).
NAME_PREFIX = "hami-gpu-"
_VERSION = "v1"
_DOMAIN = b"hami dra claim templates v1\n"

__all__ = ["NAME_PREFIX", "SIGNATURE_ANNOTATION", "SPECS_ANNOTATION", "Keys", "ProcessKeys",
           "SignatureError", "template_containers", "process_keys", "sign", "signed_templates"]


class Keys(Protocol):
    """A key ring (:class:`hami.keyring.KeyRing` has this shape)."""

    def signing_key(self) -> bytes: ...
    def verifying_keys(self) -> tuple[bytes, ...]: ...


class ProcessKeys:
    """One random 256-bit key (``secrets``) for this process's lifetime: used when no
    allocation-signing key directory is configured."""

    def __init__(self) -> None:
        self._key = secrets.token_hex(32).encode()

    def signing_key(self) -> bytes:
        """The key."""
        return self._key

    def verifying_keys(self) -> tuple[bytes, ...]:
        """The key, alone."""
        return (self._key,)


_PROCESS_KEYS: ProcessKeys | None = None


def process_keys() -> ProcessKeys:
    """This process's :class:`ProcessKeys` (made on first use)."""
    global _PROCESS_KEYS
    if _PROCESS_KEYS is None:
        _PROCESS_KEYS = ProcessKeys()
    return _PROCESS_KEYS


def template_containers(pod: Any) -> set[str] | None:
    """For a pod whose ``spec.resourceClaims`` name a ResourceClaimTemplate of hami's
    name (:data:`NAME_PREFIX`), which gets it a GPU though its containers name no GPU
    resource: the names of the containers (init or not) that use such a claim
    (``resources.claims``); None for any other pod. Never raises."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    entries = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    ours = {e.get("name") for e in entries if isinstance(e, Mapping)
            and isinstance(e.get("resourceClaimTemplateName"), str)
            and e["resourceClaimTemplateName"].startswith(NAME_PREFIX)
            } if isinstance(entries, list) else set()
    if not ours or not isinstance(spec, Mapping):
        return None
    out: set[str] = set()
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        for c in items if isinstance(items, list) else []:
            resources = c.get("resources") if isinstance(c, Mapping) else None
            claims = resources.get("claims") if isinstance(resources, Mapping) else None
            if isinstance(claims, list) and any(
                    isinstance(r, Mapping) and r.get("name") in ours for r in claims):
                out.add(str(c.get("name", "?")))
    return out


def _mac(key: bytes, namespace: str, value: str) -> str:
    message = _DOMAIN + namespace.encode() + b"\n" + value.encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(key: bytes, namespace: str, templates: Mapping[str, Mapping[str, Any]]
         ) -> dict[str, str]:
    """The two annotations for ``templates`` (name -> ResourceClaimTemplate dict, as
    :func:`hami.dra.translate.template_for` makes them) of a pod in ``namespace``."""
    specs = [templates[name]["spec"]["spec"] for name in sorted(templates)]
    value = json.dumps(specs, sort_keys=True, separators=(",", ":"))
    return {SPECS_ANNOTATION: value,
            SIGNATURE_ANNOTATION: f"{_VERSION}:{key_id(key)}:{_mac(key, namespace, value)}"}


def signed_templates(verifying_keys: Iterable[bytes], namespace: str,
                     annotations: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The templates (name -> ResourceClaimTemplate dict without namespace) the pod's
    annotations carry with a valid signature for ``namespace``. The specs are parsed
    only once the signature holds (annotations are tenant-writable).

    Raises:
        SignatureError: an annotation is missing or malformed, the key is not one of
            ``verifying_keys``, or the MAC does not match (changed, made for another
            namespace, or not made by hami).
    """
    value, signature = annotations.get(SPECS_ANNOTATION), annotations.get(SIGNATURE_ANNOTATION)
    if not isinstance(value, str) or not isinstance(signature, str) or not signature:
        raise SignatureError(f"no {SIGNATURE_ANNOTATION} and {SPECS_ANNOTATION} annotations: "
                             "the pod was not admitted by hami's webhook")
    kid, mac = split_signature(signature, SIGNATURE_ANNOTATION)
    for key in verifying_keys:
        if key_id(key) != kid:
            continue
        if not hmac.compare_digest(_mac(key, namespace, value), mac):
            raise SignatureError(f"{SPECS_ANNOTATION} does not match its signature (changed "
                                 "after admission, or signed for another namespace)")
        try:
            specs = json.loads(value)
        except (ValueError, RecursionError):
            raise SignatureError(f"{SPECS_ANNOTATION} is not JSON") from None
        if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
            raise SignatureError(f"{SPECS_ANNOTATION} is not a list of claim specs")
        return dict(template_for(spec) for spec in specs)
    raise SignatureError(f"{SIGNATURE_ANNOTATION} is made with key {kid}, which is not "
                         "accepted (rotated out, another scheduler process's, or not hami's)")
