"""A GPU pod rejected while hami's watch still counts a just-deleted pod is bound within
the chart's bound, with kube-scheduler run on the chart's own arguments
(``scheduler.kubeScheduler.podMaxInUnschedulablePodsDuration``, docs/troubleshooting.md,
"Pending for up to 40 s after a GPU was freed").

The lag is made deterministic: hami reaches the API server through a
:class:`~hami.testing.tcpgate.TcpGate`, held while pod A (holding the node's only GPU) is
deleted. kube-scheduler sees the deletion at once and retries the waiting pod B; hami,
which has not seen it, rejects B again. The test waits, through kube-scheduler's own
metrics, until kube-scheduler has handled the deletion, B was rejected after that, and B
sits in the unschedulable pool with nothing pending; only then does hami see the deletion
(the release). Nothing else happens in the cluster: no event is left to wake B, so only
kube-scheduler's own retry of unschedulable pods binds it. With kube-scheduler's default
(5 minutes, the chart value "") the wait below times out.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, codecs
from lightkube.resources.core_v1 import Node, Pod
from prometheus_client.parser import text_string_to_metric_families

from hami.testing.clusterconfig import scheduler_argv
from hami.testing.controlplane import ControlPlane, free_port, wait_until
from hami.testing.kubescheduler import scheduler_ready
from hami.testing.processes import HOST, Component
from hami.testing.tcpgate import TcpGate
from tests.deploy.chart import (
    RELEASE,
    HelmMissing,
    container,
    find,
    helm_binary,
    render,
    scheduler_config,
)

from .hami_harness import FakeAllocator, HamiProcess, Tls, gpu_pod, make_gpu_node, unique

pytestmark = pytest.mark.e2e

FLAG = "--pod-max-in-unschedulable-pods-duration"
#: How often kube-scheduler moves pods that waited longer than the flag's value out of its
#: unschedulable pool (a constant of its queue, v1.31 to v1.37).
FLUSH_PERIOD_S = 30.0
#: Time for the retry itself (a scheduling cycle, /filter, /bind, the Binding) on a loaded
#: 2-core CI machine.
MARGIN_S = 20.0
MEMORY_MIB = 24576
GROUP = "e2e-requeue"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def go_duration_s(text: str) -> float:
    """Seconds of a Go duration as the chart's schema admits it (``10s``, ``1m30s``)."""
    parts = _DURATION.findall(text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(float(n) * _UNITS[u] for n, u in parts)


@pytest.fixture(scope="module")
def chart_helm() -> None:
    """The chart is rendered by helm: skip without it, unless ``HAMI_DEPLOY_REQUIRED=1``."""
    try:
        helm_binary()
    except HelmMissing as err:
        if os.environ.get("HAMI_DEPLOY_REQUIRED") == "1":
            pytest.fail(str(err))
        pytest.skip(str(err))


def chart_kube_scheduler(scheduler_name: str) -> tuple[list[str], dict[str, Any]]:
    """The chart's kube-scheduler container arguments and KubeSchedulerConfiguration
    (default values, profile ``scheduler_name``)."""
    objs = render({"schedulerName": scheduler_name})
    spec = find(objs, "Deployment", f"{RELEASE}-scheduler")["spec"]["template"]["spec"]
    return list(container(spec, "kube-scheduler")["args"]), scheduler_config(objs)


class ChartKubeScheduler:
    """kube-scheduler with the chart's arguments and configuration, serving on a free port
    of 127.0.0.1 as the control plane's own (so its ``/metrics`` can be read); the
    extender URL, the kubeconfig and leader election (off: one instance, and the chart's
    Lease namespace does not exist here) are the only changes."""

    def __init__(self, cp: ControlPlane, scheduler_name: str, extender_port: int) -> None:
        self.cp = cp
        args, config = chart_kube_scheduler(scheduler_name)
        [retry] = [a.split("=", 1)[1] for a in args if a.startswith(FLAG + "=")]
        self.retry_s = go_duration_s(retry)
        config["extenders"][0]["urlPrefix"] = f"http://{HOST}:{extender_port}"
        config["clientConnection"]["kubeconfig"] = str(cp.kubeconfig)
        config["leaderElection"] = {"leaderElect": False}
        self.config_path = cp.workdir / f"kube-scheduler-{scheduler_name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.args = [f"--config={self.config_path}" if a.startswith("--config=") else a
                     for a in args]
        self.port = 0
        self.component: Component | None = None

    def start(self) -> ChartKubeScheduler:
        self.port = free_port()
        argv = scheduler_argv(self.cp.binaries["kube-scheduler"], config=self.config_path,
                              port=self.port, pki=self.cp.pki_dir,
                              kubeconfig=self.cp.kubeconfig, verbosity=self.cp.verbosity,
                              unschedulable_retry=None, extra=self.args)
        # the chart's flag, not the control plane's own (a 5 s retry hides the lag)
        assert [a for a in argv if a.startswith(FLAG)] == [
            a for a in self.args if a.startswith(FLAG)], argv
        self.component = self.cp._spawn(f"kube-scheduler-chart-{self.port}", argv)  # noqa: SLF001
        ctx = self.cp.ssl_context()
        self.component.wait_healthy(lambda: scheduler_ready(f"https://{HOST}:{self.port}", ctx),
                                    "/readyz", 60.0)
        return self

    def stop(self) -> None:
        if self.component is not None:
            self.component.stop()

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Its ``/metrics`` (the admin certificate authorises the read): sample name and
        labels -> value."""
        with urllib.request.urlopen(f"https://{HOST}:{self.port}/metrics", timeout=5,
                                    context=self.cp.ssl_context()) as resp:
            text = resp.read().decode()
        return {(s.name, frozenset(s.labels.items())): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return sum(v for (n, lab), v in self.metrics().items() if n == name and want <= lab)

    def handled_deletions(self) -> float:
        """Deletions of bound pods its event handler has finished (queue moves included)."""
        return self.value("scheduler_event_handling_duration_seconds_count",
                          event="AssignedPodDelete")

    def only_in_unschedulable_pool(self) -> bool:
        """One pod pending, in the unschedulable pool: none active, backing off or in
        flight (a pod in flight is in no queue)."""
        pending = {q: self.value("scheduler_pending_pods", queue=q)
                   for q in ("active", "backoff", "unschedulable")}
        return pending == {"active": 0, "backoff": 0, "unschedulable": 1}


def gated_kubeconfig(cp: ControlPlane, gate: TcpGate, path: Path) -> Path:
    """The admin kubeconfig with its server moved to the gate (the apiserver's certificate
    names 127.0.0.1, so TLS holds through the relay)."""
    doc = yaml.safe_load(cp.kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = f"https://{HOST}:{gate.port}"
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def rejections(hami: HamiProcess, pod: str) -> int:
    """``/filter`` answers that found no node for ``default/<pod>`` (hami's decision log)."""
    mark = f"msg=filter pod=default/{pod} result=unschedulable"
    return sum(1 for line in hami.log_path.read_text(errors="replace").splitlines()
               if mark in line)


def pod_of(client: Any, name: str) -> Any | None:
    try:
        return client.get(Pod, name, namespace="default")
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise


@dataclass
class Chain:
    kube_scheduler: ChartKubeScheduler
    hami: HamiProcess
    gate: TcpGate
    node: str
    scheduler_name: str


@pytest.fixture
def chain(control_plane: ControlPlane, kube_client: Any, chart_helm: None,
          tmp_path: Path) -> Iterator[Chain]:
    """hami behind the gate, kube-scheduler on the chart's arguments, a 1-GPU node."""
    name = unique("hami-requeue")
    extender_port = free_port()
    gate = TcpGate(HOST, control_plane.apiserver_port).start()
    hami = HamiProcess(control_plane, Tls(tmp_path / "tls"), tmp_path,
                       args=[f"--scheduler-name={name}",
                             f"--extender-http-bind={HOST}:{extender_port}"],
                       kubeconfig=gated_kubeconfig(control_plane, gate, tmp_path / "gated"))
    allocator = FakeAllocator(control_plane)
    kube_scheduler = ChartKubeScheduler(control_plane, name, extender_port)
    node = unique("requeue")
    try:
        make_gpu_node(kube_client, node, gpus=1, memory_mib=MEMORY_MIB, labels={GROUP: node})
        hami.start()
        allocator.start()
        kube_scheduler.start()
        yield Chain(kube_scheduler, hami, gate, node, name)
    finally:
        gate.release()
        kube_scheduler.stop()
        allocator.stop()
        hami.stop()
        gate.stop()
        for pod in kube_client.list(Pod, namespace="default", labels={GROUP: node}):
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, pod.metadata.name, namespace="default",
                                   grace_period=0)
        with contextlib.suppress(ApiError):
            kube_client.delete(Node, node)


def test_a_pod_rejected_while_hami_lags_is_bound_within_the_charts_bound(
        chain: Chain, kube_client: Any) -> None:
    kube_scheduler, hami, gate, node = chain.kube_scheduler, chain.hami, chain.gate, chain.node
    assert kube_scheduler.retry_s == 10.0  # the chart's default
    first, second = unique("holder"), unique("waiter")

    def create(pod: str) -> None:
        obj = gpu_pod(pod, memory_mib=MEMORY_MIB, scheduler_name=chain.scheduler_name,
                      node_selector={GROUP: node})
        obj["metadata"]["labels"] = {GROUP: node}
        kube_client.create(codecs.from_dict(obj))

    def settled(pod: str) -> bool:
        """Bound, served (bind-phase=success) and the node lock released."""
        obj = pod_of(kube_client, pod)
        ann = (obj.metadata.annotations or {}) if obj else {}
        lock = (kube_client.get(Node, node).metadata.annotations or {}).get(
            "hami.io/mutex.lock", "")
        return bool(obj and obj.spec.nodeName == node
                    and ann.get("hami.io/bind-phase") == "success" and not lock)

    create(first)
    wait_until(lambda: settled(first), timeout_s=60, what="the first pod bound and served",
               alive=hami.alive)
    create(second)
    wait_until(lambda: rejections(hami, second) >= 1
               and kube_scheduler.only_in_unschedulable_pool(), timeout_s=60,
               what="the second pod rejected (the card is full)", alive=hami.alive)

    deleted_before = kube_scheduler.handled_deletions()
    seen = rejections(hami, second)
    gate.hold()
    try:
        kube_client.delete(Pod, first, namespace="default", grace_period=0)
        # Its handler moves the pool's pods before it counts itself: from here on the pod
        # reaches the pool again only through an attempt after the deletion (one in
        # flight then goes to the backoff queue instead).
        wait_until(lambda: kube_scheduler.handled_deletions() > deleted_before, timeout_s=30,
                   what="kube-scheduler handled the deletion")
        # kube-scheduler retried the pod; hami, behind the gate, still counts the
        # deleted pod and rejects it, and nothing is left to move it again.
        wait_until(lambda: kube_scheduler.only_in_unschedulable_pool()
                   and rejections(hami, second) > seen, timeout_s=60,
                   what="the second pod rejected after the deletion, back in the pool",
                   alive=hami.alive)
        rejected = time.monotonic()
        flushed = kube_scheduler.value("scheduler_queue_incoming_pods_total",
                                       event="UnschedulableTimeout")
    finally:
        gate.release()

    bound = kube_scheduler.retry_s + FLUSH_PERIOD_S + MARGIN_S
    wait_until(lambda: bool((p := pod_of(kube_client, second)) and p.spec.nodeName == node),
               timeout_s=bound, what=f"the second pod bound within {bound:.0f} s of its "
               "rejection (kube-scheduler's retry of unschedulable pods)", alive=hami.alive)
    waited = time.monotonic() - rejected
    print(f"bound {waited:.1f} s after the rejection")
    # What moved it was that retry: no cluster event followed the rejection.
    assert kube_scheduler.value("scheduler_queue_incoming_pods_total",
                                event="UnschedulableTimeout") > flushed
