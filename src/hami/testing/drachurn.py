"""DRA mode churn on a real control plane: GPU pods of random shapes created (through the
API server, so hami's webhook translates them), their claims made by the resourceclaim
controller, the pods deleted; then the counts of the objects DRA mode leaves behind
(pods, ResourceClaims, hami's ResourceClaimTemplates) are read until they are back
where they started. Used by tests/e2e/test_dra_churn_e2e.py and bench/bench_dra_churn.py.
"""

from __future__ import annotations

import random
import time
from typing import Any

from hami.dra.translate import TEMPLATE_LABEL

__all__ = ["churn", "counts", "random_pod", "wait_counts"]


def random_pod(rng: random.Random, name: str, namespace: str) -> dict[str, Any]:
    """A pod asking 1-2 GPUs of 500-8000 MiB (250 MiB steps) and 0-50 % cores: about
    600 distinct requests, so pods rarely share a template."""
    limits: dict[str, str] = {"nvidia.com/gpu": str(rng.choice((1, 1, 1, 2))),
                              "nvidia.com/gpumem": str(250 * rng.randint(2, 32))}
    cores = rng.choice((0, 0, 10, 20, 30, 50))
    if cores:
        limits["nvidia.com/gpucores"] = str(cores)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "pause",
                                     "resources": {"limits": limits}}]}}


def counts(client: Any, namespace: str) -> dict[str, int]:
    """Pods, ResourceClaims and ResourceClaimTemplates of ``namespace``, and hami's
    templates (label ``hami.io/dra-template``) in every namespace. ``client``: a
    lightkube ``Client``."""
    from lightkube.resources.core_v1 import Pod
    from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimTemplate

    return {"pods": len(list(client.list(Pod, namespace=namespace))),
            "resourceclaims": len(list(client.list(ResourceClaim, namespace=namespace))),
            "resourceclaimtemplates": len(list(client.list(ResourceClaimTemplate,
                                                           namespace=namespace))),
            "hami_templates_all_namespaces": len(list(client.list(
                ResourceClaimTemplate, namespace="*", labels={TEMPLATE_LABEL: "true"})))}


def _claimed(client: Any, namespace: str, names: set[str]) -> set[str]:
    from lightkube.resources.core_v1 import Pod

    done = set()
    for pod in client.list(Pod, namespace=namespace):
        statuses = (pod.status.resourceClaimStatuses if pod.status else None) or []
        if pod.metadata.name in names and statuses and all(s.resourceClaimName
                                                           for s in statuses):
            done.add(pod.metadata.name)
    return done


def churn(client: Any, namespace: str, pods: int, *, seed: int = 0, batch: int = 25,
          timeout_s: float = 120.0) -> dict[str, Any]:
    """Create ``pods`` random GPU pods in batches of ``batch``; once every pod of a batch
    has its claims, delete the batch. Returns ``{"pods", "templates_seen", "seconds"}``
    (templates seen: the most hami templates of ``namespace`` at once).

    Raises:
        TimeoutError: a batch's claims were not all made within ``timeout_s``.
    """
    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod

    rng = random.Random(seed)
    started, most = time.monotonic(), 0
    for first in range(0, pods, batch):
        names = {f"churn-{i}" for i in range(first, min(pods, first + batch))}
        for name in sorted(names):
            client.create(codecs.from_dict(random_pod(rng, name, namespace)))
        deadline = time.monotonic() + timeout_s
        while (done := _claimed(client, namespace, names)) != names:
            if time.monotonic() > deadline:
                raise TimeoutError(f"claims of {sorted(names - done)[:5]} not made in "
                                   f"{timeout_s:g} s")
            time.sleep(0.3)
        most = max(most, counts(client, namespace)["resourceclaimtemplates"])
        for name in names:
            client.delete(Pod, name, namespace=namespace, grace_period=0)
    return {"pods": pods, "templates_seen": most,
            "seconds": round(time.monotonic() - started, 1)}


def wait_counts(client: Any, namespace: str, expected: dict[str, int],
                timeout_s: float = 120.0) -> dict[str, int]:
    """Read :func:`counts` until it equals ``expected`` or ``timeout_s`` passes; the last
    counts either way."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = counts(client, namespace)
        if now == expected or time.monotonic() > deadline:
            return now
        time.sleep(1.0)
