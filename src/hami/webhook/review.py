"""AdmissionReview (admission.k8s.io v1 and v1beta1) in and out (HAMi v2.10).

:func:`review` wraps the pure :func:`hami.core.admission.admit` for Pod CREATE and
:func:`~hami.core.admission.admit_ephemeral` for ``pods/ephemeralcontainers`` UPDATE (other
operations and subresources are allowed unchanged); it never raises: a body
that is not an AdmissionReview gets a response with ``allowed: false`` and code 400
(and the webhook's ``failurePolicy`` decides what the apiserver does with it).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from hami.core.admission import admit, admit_ephemeral
from hami.core.config import SchedulerConfig
from hami.core.quota import QuotaLedger
from hami.core.vendor_quota import VendorQuota

JSON = dict[str, Any]
API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


def _response(api_version: str, uid: str, allowed: bool, *, code: int = 200,
              message: str = "", patch: list[JSON] | None = None) -> JSON:
    resp: JSON = {"uid": uid, "allowed": allowed}
    if not allowed or message:
        status: JSON = {"code": code, "message": message}
        if not allowed:
            status["reason"] = "Forbidden" if code == 403 else "BadRequest"
            status["status"] = "Failure"
        resp["status"] = status
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": resp}


def review(body: bytes, config: SchedulerConfig, quota: QuotaLedger | None,
           vendor_quota: VendorQuota | None = None) -> JSON:
    """The AdmissionReview reply for a request body (``vendor_quota``: the other
    vendors' namespace quota, HAMi v2.10)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        return _response(API_VERSIONS[0], "", False, code=400,
                         message=f"invalid AdmissionReview: {str(exc)[:200]}")
    if not isinstance(doc, Mapping):
        return _response(API_VERSIONS[0], "", False, code=400,
                         message="invalid AdmissionReview: not a JSON object")
    api_version = doc.get("apiVersion") if doc.get("apiVersion") in API_VERSIONS else API_VERSIONS[0]
    request = doc.get("request")
    if not isinstance(request, Mapping):
        return _response(str(api_version), "", False, code=400,
                         message="invalid AdmissionReview: no request")
    uid = request.get("uid") if isinstance(request.get("uid"), str) else ""
    kind = request.get("kind")
    if isinstance(kind, Mapping) and kind.get("kind") not in (None, "Pod"):
        return _response(str(api_version), str(uid), True, message="not a pod")
    pod = request.get("object")
    if not isinstance(pod, Mapping):
        return _response(str(api_version), str(uid), False, code=400,
                         message="invalid AdmissionReview: request.object is not a Pod")
    pod = _with_namespace(pod, request.get("namespace"))
    sub_resource = str(request.get("subResource") or "")
    operation = str(request.get("operation") or "")
    ephemeral = (sub_resource, operation) == ("ephemeralcontainers", "UPDATE")
    if not ephemeral and (sub_resource or operation not in ("", "CREATE")):
        return _response(str(api_version), str(uid), True,
                         message="neither a pod creation nor an ephemeral container")
    try:
        if ephemeral:
            old = request.get("oldObject")
            result = admit_ephemeral(pod, old if isinstance(old, Mapping) else None, config)
        else:
            result = admit(pod, config, quota, vendor_quota=vendor_quota)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return _response(str(api_version), str(uid), False, code=400,
                         message=f"malformed pod: {type(exc).__name__}: {str(exc)[:200]}")
    if not result.allowed:
        return _response(str(api_version), str(uid), False, code=result.code,
                         message=result.message)
    return _response(str(api_version), str(uid), True, message=result.message,
                     patch=[op for op in result.patch if not _empty_resources(op)])


def _empty_resources(op: Mapping[str, Any]) -> bool:
    """The core's mutation adds ``resources: {}`` to containers that had none; that op
    changes nothing the apiserver keeps, and a pod without GPUs must come back untouched."""
    path = str(op.get("path", ""))
    return (op.get("op") == "add" and op.get("value") == {}
            and path.endswith("/resources") and path.startswith("/spec/"))


def _with_namespace(pod: Mapping[str, Any], namespace: Any) -> Mapping[str, Any]:
    """The pod with ``metadata.namespace`` taken from the request when the object has none
    (the namespace decides quotas and the priority-0 grant)."""
    meta = pod.get("metadata")
    if not isinstance(namespace, str) or not namespace or (
            isinstance(meta, Mapping) and meta.get("namespace")):
        return pod
    return {**pod, "metadata": {**(meta if isinstance(meta, Mapping) else {}),
                                "namespace": namespace}}
