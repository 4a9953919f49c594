"""The real-node bed (hami.testing.gpubed): one per test module, shared by its tests.

Needs root, cgroup v1, containerd, runc, the CNI plugins and the kubelet built by
hack/k8s/build.sh. Without them the tests skip with one line saying what is missing;
with ``HAMI_NODE_REQUIRED=1`` (CI, ``make test``) they fail instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from hami.testing.controlplane import BinariesMissing, default_bin_dir
from hami.testing.gpubed import GpuBed, wait_pod_done
from hami.testing.images import missing_tools
from hami.testing.nodeprereq import missing_prerequisites

pytestmark = pytest.mark.e2e


def unavailable() -> str | None:
    """Why the bed cannot run here, or None."""
    reasons = missing_prerequisites(default_bin_dir() / "kubelet")
    tools = missing_tools()
    if tools:
        reasons.append("missing image tools " + ", ".join(tools) +
                       " (Debian: umoci skopeo busybox-static)")
    if not (default_bin_dir() / "kube-apiserver").exists():
        reasons.append(f"no kube-apiserver in {default_bin_dir()} (run hack/k8s/build.sh)")
    return "; ".join(reasons) or None


def skip_or_fail(reason: str) -> None:
    if os.environ.get("HAMI_NODE_REQUIRED") == "1":
        pytest.fail(f"real node required (HAMI_NODE_REQUIRED=1): {reason}")
    pytest.skip(f"real node: {reason}")


@contextlib.contextmanager
def running_bed(**kwargs: Any) -> Iterator[GpuBed]:
    """A started :class:`GpuBed`; skipped (or failed in CI) where it cannot run."""
    reason = unavailable()
    if reason:
        skip_or_fail(reason)
    bed = GpuBed(**kwargs)
    try:
        bed.start()
    except BinariesMissing as err:
        skip_or_fail(str(err))
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture(scope="module")
def bed() -> Iterator[GpuBed]:
    with running_bed() as b:
        yield b


@pytest.fixture
def client(bed: GpuBed) -> Iterator[Any]:
    """Admin client; the test's pods in ``default`` are deleted afterwards (and waited
    for), so a failed test does not hold the next one's GPUs."""
    from lightkube.resources.core_v1 import Pod

    from hami.testing.controlplane import wait_until

    c = bed.client()
    yield c
    containers: set[str] = set()
    for p in c.list(Pod, namespace="default"):
        st = p.status
        for s in [*(st.containerStatuses or []), *(st.initContainerStatuses or [])] if st else []:
            if s.containerID:
                containers.add(str(s.containerID).split("://", 1)[-1])
        with contextlib.suppress(Exception):
            c.delete(Pod, p.metadata.name, namespace="default", grace_period=0)
    wait_until(lambda: not list(c.list(Pod, namespace="default")), timeout_s=60,
               what="the test's pods deleted")
    # a force-deleted pod leaves the API at once; its processes (and the card memory
    # they hold) go when the kubelet has killed its containers
    if bed.node is not None and containers:
        node = bed.node
        wait_until(lambda: not containers & node.running_task_ids(), timeout_s=90,
                   what="the test's containers stopped")
    c.close()


def run_pod(client: Any, manifest: dict[str, Any], timeout_s: float = 90.0) -> Any:
    """Create the pod, wait until it finished; return it."""
    from lightkube import codecs

    client.create(codecs.from_dict(manifest))
    return wait_pod_done(client, manifest["metadata"]["name"], timeout_s=timeout_s)
