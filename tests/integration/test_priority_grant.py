"""Task priority 0 is granted per namespace by the operator, not taken by the pod
(issue 25 item 2), through the scheduler's real aiohttp app: the webhook refuses
``nvidia.com/priority: "0"`` outside ``--high-priority-namespaces`` and ``/filter``
refuses it again for a pod that never met the webhook; granted namespaces and other
priorities are admitted as before."""

from __future__ import annotations

import base64
import json
from typing import Any

from hami.core.isolation import violations
from hami.devices.registry import make_config

from .fake_kube import FakeKube
from .support import gpu_pod, ledger_snapshot, node, run, serving


def _review(pod: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                               "operation": "CREATE", "object": pod}
    if namespace is not None:
        request["namespace"] = namespace
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _prio_pod(name: str, namespace: str, priority: str) -> dict[str, Any]:
    pod = gpu_pod(name, memory_mib=1000, namespace=namespace)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/priority"] = priority
    return pod


def _cluster() -> FakeKube:
    kube = FakeKube()
    kube.put("Node", node("n1"))
    return kube


def test_webhook_refuses_priority_0_outside_granted_namespaces() -> None:
    async def scenario() -> None:
        async with serving(_cluster(), high_priority_namespaces=("inference",)) as h:
            for value in ("0", "00", "0m"):
                resp = (await h.post("/webhook", _review(_prio_pod("p", "tenant", value))))[
                    "response"]
                assert not resp["allowed"] and resp["status"]["code"] == 403, value
                message = resp["status"]["message"]
                assert "nvidia.com/priority 0" in message and "namespace tenant" in message
                assert "--high-priority-namespaces" in message
            # the object without a namespace: the request's namespace counts
            pod = _prio_pod("p", "tenant", "0")
            del pod["metadata"]["namespace"]
            resp = (await h.post("/webhook", _review(pod, "tenant")))["response"]
            assert not resp["allowed"]
            resp = (await h.post("/webhook", _review(pod, "inference")))["response"]
            assert resp["allowed"]
            # the env written by hand, without the limit, is refused too
            pod = gpu_pod("e", memory_mib=1000, namespace="tenant")
            pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_TASK_PRIORITY", "value": "0"}]
            resp = (await h.post("/webhook", _review(pod)))["response"]
            assert not resp["allowed"]
            assert "CUDA_TASK_PRIORITY" in resp["status"]["message"]

    run(scenario)


def test_webhook_admits_priority_0_in_a_granted_namespace_and_priority_1_anywhere() -> None:
    async def scenario() -> None:
        async with serving(_cluster(), high_priority_namespaces=("inference",)) as h:
            resp = (await h.post("/webhook", _review(_prio_pod("p", "inference", "0"))))[
                "response"]
            assert resp["allowed"], resp
            patch = json.loads(base64.b64decode(resp["patch"]))
            env = [op for op in patch if "env" in op["path"]]
            assert any(op["value"] == [{"name": "CUDA_TASK_PRIORITY", "value": "0"}]
                       or op["value"] == {"name": "CUDA_TASK_PRIORITY", "value": "0"}
                       for op in env), patch
            resp = (await h.post("/webhook", _review(_prio_pod("q", "tenant", "1"))))["response"]
            assert resp["allowed"], resp

    run(scenario)


def test_by_default_no_namespace_is_granted_priority_0() -> None:
    async def scenario() -> None:
        async with serving(_cluster()) as h:
            for ns in ("default", "kube-system", "tenant"):
                resp = (await h.post("/webhook", _review(_prio_pod("p", ns, "0"))))["response"]
                assert not resp["allowed"], ns

    run(scenario)


def test_filter_refuses_priority_0_of_a_pod_that_skipped_the_webhook() -> None:
    async def scenario() -> None:
        async with serving(_cluster(), high_priority_namespaces=("inference",)) as h:
            before = ledger_snapshot(h.engine)
            pod = _prio_pod("evil", "tenant", "0")
            pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_TASK_PRIORITY", "value": "0"}]
            live = h.kube.put("Pod", pod)
            webhook = (await h.post("/webhook", _review(pod)))["response"]
            result = await h.filter(live, ["n1"])
            assert result["NodeNames"] is None
            assert result["Error"] == webhook["status"]["message"], result
            assert ledger_snapshot(h.engine) == before
            granted = _prio_pod("fast", "inference", "0")
            granted["spec"]["containers"][0]["env"] = [
                {"name": "CUDA_TASK_PRIORITY", "value": "0"}]
            live = h.kube.put("Pod", granted)
            assert (await h.filter(live, ["n1"]))["NodeNames"] == ["n1"]

    run(scenario)


def test_pods_naming_hami_s_claim_follow_the_grant_too() -> None:
    """DRA mode: a container using hami's claim directly keeps the rule (its env is what
    the monitor reads as its priority)."""
    from dataclasses import replace

    from hami.core.isolation import security_violations

    config = replace(make_config(), high_priority_namespaces=("inference",))
    pod = {"metadata": {"name": "d", "namespace": "tenant"},
           "spec": {"containers": [{"name": "main", "env": [
               {"name": "CUDA_TASK_PRIORITY", "value": " 0 "}]}]}}
    assert any("priority" in p for p in security_violations(pod, config, ("main",)))
    pod["metadata"]["namespace"] = "inference"
    assert security_violations(pod, config, ("main",)) == []
    assert violations(_prio_pod("x", "inference", "0"), config) == []
