"""The DRA webhook against a hostile pod creator: hand-written allocation annotations,
pods that name claims and GPUs at once, selector values CEL cannot carry. The API
client is the recording stub of ``test_webhook``."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import jsonpatch

from hami.api import names
from tests.dra.test_webhook import _Client, _hook, _pod, _review

FORGED = {names.VGPU_NODE: "n1", names.DEVICES_ALLOCATED: "GPU-0,NVIDIA,80000,100:;",
          names.DEVICES_TO_ALLOCATE: "GPU-0,NVIDIA,80000,100:;", names.BIND_PHASE: "success",
          names.ALLOCATION_SIGNATURE: "v1:00000000:forged"}


def _forged(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["annotations"] = {**FORGED, "team": "a"}
    pod["metadata"]["labels"] = {names.VGPU_NODE: "n1", "app": "x"}
    return pod


def _patched(pod: dict[str, Any], resp: dict[str, Any]) -> dict[str, Any]:
    ops = json.loads(base64.b64decode(resp["patch"])) if "patch" in resp else []
    return jsonpatch.apply_patch(pod, ops)  # type: ignore[no-any-return]


def test_a_translated_pod_loses_its_hand_written_allocation() -> None:
    """The scheduler charges a pod of its own by these annotations, and the DRA webhook
    gives translated pods hami's schedulerName: a hand-written grant would mark cards full."""
    pod = _forged(_pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}))
    hook, _ = _hook(_Client())
    resp = asyncio.run(hook(_review(pod)))["response"]
    assert resp["allowed"], resp
    out = _patched(pod, resp)
    assert out["spec"]["resourceClaims"]
    assert {k: v for k, v in out["metadata"]["annotations"].items()
            if not k.startswith("hami.io/dra-claim-templates")} == {"team": "a"}
    assert out["metadata"]["labels"] == {"app": "x"}
    assert names.DEVICES_ALLOCATED in resp["status"]["message"]


def test_a_pod_naming_claims_and_gpus_is_checked_and_stripped() -> None:
    """"Left alone" (it names ResourceClaims) is not "unchecked": the isolation rules and
    the removal of allocation annotations hold as for any pod that asks for GPUs."""
    claims = [{"name": "x", "resourceClaimName": "y"}]
    hook, seen = _hook(_Client())
    priv = _pod({"nvidia.com/gpu": 1}, hostPID=True, resourceClaims=claims)
    denied = asyncio.run(hook(_review(priv)))["response"]
    assert not denied["allowed"] and "hostPID" in denied["status"]["message"], denied
    pod = _forged(_pod({"nvidia.com/gpu": 1}, resourceClaims=claims))
    resp = asyncio.run(hook(_review(pod)))["response"]
    assert resp["allowed"], resp
    out = _patched(pod, resp)
    assert out["metadata"]["annotations"] == {"team": "a"}
    assert out["spec"] == pod["spec"] and not seen


def test_selector_lists_too_long_for_the_api_are_a_clear_denial() -> None:
    """A CEL selector longer than the API accepts (10 KiB) would fail the template's
    creation with an apiserver error (the pod then skips translation under
    ``failurePolicy: Ignore``); the webhook refuses it itself, naming the annotation."""
    uuids = ",".join(f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd" for i in range(300))
    pod = _pod({"nvidia.com/gpu": 1})
    pod["metadata"]["annotations"] = {"nvidia.com/use-gpuuuid": uuids}
    client = _Client()
    hook, _ = _hook(client)
    resp = asyncio.run(hook(_review(pod)))["response"]
    assert not resp["allowed"], resp
    assert "nvidia.com/use-gpuuuid" in resp["status"]["message"]
    assert "too long" in resp["status"]["message"] and not client.created
    few = _pod({"nvidia.com/gpu": 1})
    few["metadata"]["annotations"] = {"nvidia.com/use-gpuuuid": ",".join(uuids.split(",")[:50])}
    assert asyncio.run(hook(_review(few)))["response"]["allowed"]


def test_claims_the_tenant_made_itself_count_against_the_quota() -> None:
    """A tenant that may create ResourceClaims gets cards without hami's templates; what
    those claims hold or ask of hami's GPUs still counts for the next translated pod.
    Claims of other drivers and classes do not."""
    from hami.core.quota import QuotaLedger
    from hami.devices.registry import make_config
    from tests.dra.test_webhook import _claim, _slice

    own = _claim("mine", {"memory": "1Mi"}, consumed={"memory": f"{16384 * 2**20}",
                                                       "cores": "100"})
    del own["metadata"]["labels"]
    pending = _claim("later", {"memory": "2000Mi"})
    del pending["metadata"]["labels"]
    nic = _claim("nic", {"memory": "9000Mi"})
    del nic["metadata"]["labels"]
    nic["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nic.example.com"
    quota = QuotaLedger(make_config().registry["NVIDIA"].resource_names())
    quota.set_quota("ns", "gpu", {"limits.nvidia.com/gpumem": 20000})
    client = _Client([_slice("n1", 16384, 16384)], [own, pending, nic])
    hook, _ = _hook(client, quota)
    over = asyncio.run(hook(_review(_pod({"nvidia.com/gpu": 1,
                                          "nvidia.com/gpumem": 2000}))))["response"]
    assert not over["allowed"] and "exceeding resource quota" in over["status"]["message"]
    fits = asyncio.run(hook(_review(_pod({"nvidia.com/gpu": 1,
                                          "nvidia.com/gpumem": 1000}))))["response"]
    assert fits["allowed"], fits


def test_signed_specs_too_large_for_the_pods_annotations_are_a_clear_denial() -> None:
    """The template specs travel on the pod (signed): 40 containers asking different
    amounts with a long selector would make annotations past the API's 256 KiB, which
    the API server would refuse with the pod; the webhook refuses it itself."""
    uuids = ",".join(f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd" for i in range(150))
    pod = _pod({"nvidia.com/gpu": 1})
    pod["metadata"]["annotations"] = {"nvidia.com/use-gpuuuid": uuids}
    pod["spec"]["containers"] = [
        {"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": 1,
                                                   "nvidia.com/gpumem": 100 + i}}}
        for i in range(40)]
    hook, _ = _hook(_Client())
    resp = asyncio.run(hook(_review(pod)))["response"]
    assert not resp["allowed"], resp
    assert "hami.io/dra-claim-templates" in resp["status"]["message"]
    assert "262144" in resp["status"]["message"]
    pod["spec"]["containers"] = pod["spec"]["containers"][:4]
    assert asyncio.run(hook(_review(pod)))["response"]["allowed"]
