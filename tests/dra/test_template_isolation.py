"""DRA mode: a pod that gets a GPU through one of hami's ``hami-gpu-<hash>`` templates
passes the isolation rules even when it asks for no ``nvidia.com/gpu`` itself (a tenant
naming the template, with the signed specs copied from a pod hami admitted) and when a
privileged ephemeral container is added to a translated pod (``kubectl debug``), whose
GPU resources the translation moved into a claim. The fallback is the real normal
webhook (:func:`hami.webhook.review.review`)."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from typing import Any

import jsonpatch

from hami.devices.registry import make_config
from hami.dra.webhook import DraWebhook
from hami.webhook.review import review
from tests.dra.test_webhook import _Client, _pod, _review

CONFIG = make_config()


def _hook() -> DraWebhook:
    return DraWebhook(_Client(), CONFIG, lambda body: review(body, CONFIG, None))


def _call(hook: DraWebhook, body: bytes) -> dict[str, Any]:
    response: dict[str, Any] = asyncio.run(hook(body))["response"]
    return response


def _translated(hook: DraWebhook) -> dict[str, Any]:
    """A GPU pod as the API server stores it after hami's webhook translated it."""
    pod = _pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
    resp = _call(hook, _review(pod))
    assert resp["allowed"]
    out: dict[str, Any] = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))
    assert not any(k.startswith("nvidia.com/")
                   for k in out["spec"]["containers"][0]["resources"].get("limits", {}))
    return out


def _copied(translated: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A tenant's own pod naming the translated pod's template and carrying its signed
    annotations (readable by anyone who can read pods of the namespace)."""
    container = copy.deepcopy(translated["spec"]["containers"][0])
    container.update(spec.pop("container", {}))
    return {"metadata": {"name": "copy", "namespace": "ns",
                         "annotations": dict(translated["metadata"]["annotations"])},
            "spec": {"resourceClaims": translated["spec"]["resourceClaims"],
                     "containers": [container], **spec}}


def test_a_pod_naming_hamis_template_passes_the_isolation_rules() -> None:
    hook = _hook()
    translated = _translated(hook)
    privileged = _copied(translated, container={"securityContext": {"privileged": True}})
    resp = _call(hook, _review(privileged))
    assert not resp["allowed"] and "privileged" in resp["status"]["message"], resp
    host_pid = _copied(translated, hostPID=True)
    resp = _call(hook, _review(host_pid))
    assert not resp["allowed"] and "hostPID" in resp["status"]["message"], resp
    caps = _copied(translated, container={"securityContext": {
        "capabilities": {"add": ["SYS_ADMIN"]}}})
    assert not _call(hook, _review(caps))["allowed"]
    # the translated pod itself, sent again (reinvocationPolicy: IfNeeded), and a plain
    # copy stay allowed
    assert _call(hook, _review(translated))["allowed"]
    assert _call(hook, _review(_copied(translated)))["allowed"]


def _debug(pod: dict[str, Any], **ctx: Any) -> bytes:
    new = copy.deepcopy(pod)
    new["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "busybox",
                                           "securityContext": ctx}]
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u", "kind": {"kind": "Pod"},
                                   "subResource": "ephemeralcontainers",
                                   "operation": "UPDATE", "object": new,
                                   "oldObject": pod}}).encode()


def test_a_privileged_debug_container_is_refused_on_a_translated_pod() -> None:
    hook = _hook()
    translated = _translated(hook)
    resp = _call(hook, _debug(translated, privileged=True))
    assert not resp["allowed"] and "privileged" in resp["status"]["message"], resp
    assert not _call(hook, _debug(translated, capabilities={"add": ["CAP_SYS_ADMIN"]}))[
        "allowed"]
    assert _call(hook, _debug(translated))["allowed"]


def test_a_container_using_hamis_claim_keeps_the_env_and_mount_rules() -> None:
    """The container that uses the claim of hami's template is a GPU container: its own
    env may not set the limits the claim's CDI spec sets, nor may it mount over the
    paths the spec mounts; a container without the claim may."""
    hook = _hook()
    translated = _translated(hook)
    env = _copied(translated, container={"env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0",
                                                  "value": "80000m"}]})
    resp = _call(hook, _review(env))
    assert not resp["allowed"] and "CUDA_DEVICE_MEMORY_LIMIT_0" in resp["status"]["message"]
    mount = _copied(translated, container={"volumeMounts": [
        {"name": "v", "mountPath": "/etc/ld.so.preload"}]})
    resp = _call(hook, _review(mount))
    assert not resp["allowed"] and "ld.so.preload" in resp["status"]["message"], resp
    sidecar = _copied(translated)
    sidecar["spec"]["containers"].append({"name": "side", "env": [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "1m"}]})
    assert _call(hook, _review(sidecar))["allowed"]
