"""GPU test pods for the real-node bed (:mod:`hami.testing.gpubed`): manifests that run
libvgpu's ``vgtest`` on the stub driver in the GPU test image, and waiting for them."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from hami.testing import images
from hami.testing.controlplane import ControlPlaneError, wait_until

#: The node directory (a hostPath in GPU test pods) where the stub driver keeps the
#: cards' state (allocations, clock), shared by every container on the node.
STUB_DIR = "/var/lib/hami-stub-gpu"


def stub_uuid(index: int) -> str:
    """The UUID the stub driver gives its physical device ``index`` (NVML text form)."""
    return f"GPU-5a1e0000-0000-4000-8000-{index:012x}"


def gpu_test_pod(name: str, command: str, *, gpus: int = 1, memory_mib: int | None = None,
                 cores_percent: int | None = None, node: str | None = None,
                 containers: int = 1, stub_devices: int = 2, stub_memory_mib: int = 16384,
                 annotations: Mapping[str, str] | None = None,
                 extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Pod manifest (dict) running ``sh -c command`` in the GPU test image, with
    ``nvidia.com/gpu`` (+ ``gpumem`` MiB, ``gpucores`` percent) per container, the stub
    driver's state on the node's :data:`STUB_DIR`, restartPolicy Never.

    ``containers`` > 1 makes containers ``c0``, ``c1``, ... each with the same request
    and command (``$HAMI_CONTAINER`` tells them apart).
    """
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)}
    if memory_mib is not None:
        limits["nvidia.com/gpumem"] = str(memory_mib)
    if cores_percent is not None:
        limits["nvidia.com/gpucores"] = str(cores_percent)
    # the stub's processes of different containers get distinct host PIDs in NVML, as
    # the driver gives them (their own PIDs, each in a fresh PID namespace, coincide)
    # the card's clock: 10 us per grid block (a 100-block launch takes 1 ms); read by the
    # process that creates the state, so every pod passes it. VGPU_STUB_RUNTIME=nvidia:
    # the container sees only the cards NVIDIA_VISIBLE_DEVICES names, as the NVIDIA
    # container runtime arranges on a GPU node.
    env = {"VGPU_STUB_STATE": f"{STUB_DIR}/state", "VGPU_STUB_DEVICES": str(stub_devices),
           "VGPU_STUB_RUNTIME": "nvidia",
           "VGPU_STUB_MEM_MB": str(stub_memory_mib), "VGPU_STUB_UNIQUE_HOST_PIDS": "1",
           "VGPU_STUB_NS_PER_BLOCK": "10000", **dict(extra_env or {})}
    ctrs = []
    for i in range(containers):
        name_i = "c" if containers == 1 else f"c{i}"
        ctrs.append({
            "name": name_i, "image": images.GPU_TEST_IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", command],
            "env": [{"name": k, "value": v} for k, v in {**env, "HAMI_CONTAINER": name_i}.items()],
            "resources": {"limits": dict(limits)},
            "volumeMounts": [{"name": "stub-gpu", "mountPath": STUB_DIR}],
        })
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": ctrs,
        "volumes": [{"name": "stub-gpu",
                     "hostPath": {"path": STUB_DIR, "type": "DirectoryOrCreate"}}],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": dict(annotations or {})}, "spec": spec}


def webhook_configuration(name: str, url: str, ca_pem: bytes) -> dict[str, Any]:
    """A MutatingWebhookConfiguration like the chart's: CREATE pods, selected by
    namespace only, failurePolicy Fail (a broken webhook shows), 10 s timeout."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "vgpu.hami.io",
            "clientConfig": {"url": f"{url}/webhook",
                             "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"]}],
            "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "reinvocationPolicy": "Never", "timeoutSeconds": 10,
            "namespaceSelector": {"matchExpressions": [
                {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]},
        }],
    }


def wait_webhook_serving(client: Any, namespace: str = "default",
                         timeout_s: float = 60.0) -> float:
    """Wait until the apiserver calls hami's mutating webhook for pod creations in
    ``namespace``; return the seconds waited.

    A new MutatingWebhookConfiguration takes effect when the apiserver's informer has
    it, some time after the create returned (about a second when idle, more on a loaded
    machine); until then pods are admitted unmutated. The probe is a server-side dry-run
    create (nothing is stored; the webhook, ``sideEffects: None``, is called) of a pod
    that asks for ``nvidia.com/gpu``: served once it comes back with hami's
    ``schedulerName`` instead of ``default-scheduler`` (hami's webhook replaces it, as
    HAMi's does with ``forceOverwriteDefaultScheduler``) or, in DRA mode, with resource
    claims. A refused probe (the webhook not reachable yet, ``failurePolicy: Fail``) is
    tried again.

    Raises:
        ControlPlaneError: not served within ``timeout_s``.
    """
    from lightkube import ApiError, codecs

    probe = codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hami-webhook-probe", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "probe",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    last: list[str] = [""]

    def served() -> bool:
        try:
            pod = client.create(probe, dry_run=True)
        except ApiError as err:
            last[0] = str(err)
            return False
        last[0] = f"schedulerName {pod.spec.schedulerName}, claims {pod.spec.resourceClaims}"
        return (pod.spec.schedulerName not in (None, "", "default-scheduler")
                or bool(pod.spec.resourceClaims))

    try:
        return wait_until(served, timeout_s=timeout_s, what=f"hami's webhook in {namespace}")
    except ControlPlaneError as err:
        raise ControlPlaneError(f"{err}; last probe: {last[0]}") from None


def wait_pod_done(client: Any, name: str, namespace: str = "default",
                  timeout_s: float = 60.0) -> Any:
    """Wait until Pod ``name`` is Succeeded or Failed; return it.

    Raises:
        ControlPlaneError: timeout (the message has the pod's status).
    """
    from lightkube.resources.core_v1 import Pod

    last: list[Any] = [None]

    def done() -> bool:
        last[0] = client.get(Pod, name, namespace=namespace)
        return bool(last[0].status and last[0].status.phase in ("Succeeded", "Failed"))

    try:
        wait_until(done, timeout_s=timeout_s, what=f"pod {namespace}/{name} finished")
    except ControlPlaneError as err:
        raise ControlPlaneError(f"{err}; status: {last[0].status if last[0] else None}") from None
    return last[0]
