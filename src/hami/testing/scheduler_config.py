"""Render the KubeSchedulerConfiguration that registers hami as a scheduler extender.

Pure functions, no I/O: the e2e control plane writes the result to a file for
kube-scheduler, and a Helm chart renderer can emit the same document. The extender
settings are the ones HAMi's chart uses (HAMi v2.10): ``filterVerb: filter``,
``bindVerb: bind``, ``nodeCacheCapable: true``, ``weight: 1``, ``httpTimeout: 30s``,
HTTPS with ``tlsConfig.insecure: true``, and the NVIDIA resources as
``managedResources`` with ``ignoredByScheduler: true`` (kube-scheduler then neither
counts them in NodeResourcesFit nor calls the extender for pods that request none);
and ours, as hami's chart: ``preemptVerb: preempt`` (hami.scheduler.preemptflow).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: API version of the scheduler configuration (GA since Kubernetes 1.25).
SCHEDULER_CONFIG_API_VERSION = "kubescheduler.config.k8s.io/v1"

#: Scheduler name of the hami profile; pods opt in with ``spec.schedulerName``.
HAMI_SCHEDULER_NAME = "hami-scheduler"

#: Extended resources the hami extender manages (NVIDIA, HAMi v2.10).
HAMI_MANAGED_RESOURCES: tuple[str, ...] = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
)
#: The other vendors' resources, in the chart's order (``devices.vendors`` sorted by
#: section, each as listed); ``tests/unit/test_testing_support.py`` checks them against
#: :func:`hami.devices.registry.build_registry`'s defaults.
VENDOR_MANAGED_RESOURCES: tuple[str, ...] = (
    "amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores",
    "aws.amazon.com/neuron", "aws.amazon.com/neuroncore",
    "birentech.com/gpu",
    "cambricon.com/vmlu", "cambricon.com/mlu.smlu.vmemory", "cambricon.com/mlu.smlu.vcore",
    "enflame.com/gcu", "enflame.com/vgcu", "enflame.com/vgcu-percentage",
    "hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores",
    "kunlunxin.com/xpu", "kunlunxin.com/vxpu", "kunlunxin.com/vxpu-memory",
    "metax-tech.com/gpu", "metax-tech.com/sgpu", "metax-tech.com/vcore",
    "metax-tech.com/vmemory",
    "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core",
    "vastaitech.com/va",
)
#: kube-scheduler's API client limit in the chart (its own defaults are 50/100).
CLIENT_QPS = 100.0
CLIENT_BURST = 200


@dataclass(frozen=True)
class ExtenderConfig:
    """One ``extenders[]`` entry of a KubeSchedulerConfiguration.

    Attributes:
        url_prefix: base URL of the extender, e.g. ``https://127.0.0.1:8443``; the verbs
            are appended as path segments (``<url_prefix>/filter``).
        filter_verb, bind_verb: path segments of the filter and bind calls; ``None``
            leaves the verb out (the scheduler then filters or binds by itself).
        prioritize_verb: path segment of the prioritize call (DRA mode), or ``None``.
        preempt_verb: path segment of the preempt call (hami's ``preempt``), or ``None``;
            written only with a filter verb (extender mode), as the chart does.
        node_cache_capable: when true kube-scheduler sends only ``NodeNames`` (not full
            Node objects) in ExtenderArgs and expects ``NodeNames`` back.
        weight: multiplier of the extender's priorities (unused without a prioritize verb).
        http_timeout: Go duration string, e.g. ``"30s"``.
        enable_https, tls_insecure: use HTTPS; skip verification of the server cert.
        managed_resources: extended resource names; with ``ignored_by_scheduler`` they
            are left to the extender by kube-scheduler's resource fit checks.
        ignorable: when true a failing extender is skipped instead of failing the pod.
    """

    url_prefix: str
    filter_verb: str | None = "filter"
    bind_verb: str | None = "bind"
    prioritize_verb: str | None = None
    preempt_verb: str | None = "preempt"
    node_cache_capable: bool = True
    weight: int = 1
    http_timeout: str = "30s"
    enable_https: bool = True
    tls_insecure: bool = True
    managed_resources: Sequence[str] = field(
        default=(*HAMI_MANAGED_RESOURCES, *VENDOR_MANAGED_RESOURCES))
    ignored_by_scheduler: bool = True
    ignorable: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The entry as the scheduler's YAML/JSON expects it (camelCase keys)."""
        out: dict[str, Any] = {"urlPrefix": self.url_prefix}
        if self.filter_verb:
            out["filterVerb"] = self.filter_verb
        if self.bind_verb:
            out["bindVerb"] = self.bind_verb
        if self.prioritize_verb:
            out["prioritizeVerb"] = self.prioritize_verb
        if self.preempt_verb and self.filter_verb:
            out["preemptVerb"] = self.preempt_verb
        out["nodeCacheCapable"] = self.node_cache_capable
        out["weight"] = self.weight
        out["httpTimeout"] = self.http_timeout
        out["enableHTTPS"] = self.enable_https
        if self.enable_https:
            out["tlsConfig"] = {"insecure": self.tls_insecure}
        out["managedResources"] = [
            {"name": name, "ignoredByScheduler": self.ignored_by_scheduler}
            for name in self.managed_resources
        ]
        if self.ignorable:
            out["ignorable"] = True
        return out


def render_scheduler_config(
    *,
    kubeconfig: str | None,
    scheduler_name: str = HAMI_SCHEDULER_NAME,
    extender: ExtenderConfig | None = None,
    leader_elect: bool = False,
    resource_namespace: str = "kube-system",
    client_qps: float | None = CLIENT_QPS,
    client_burst: int | None = CLIENT_BURST,
) -> dict[str, Any]:
    """Build a KubeSchedulerConfiguration document (a dict ready for ``yaml.safe_dump``).

    Args:
        kubeconfig: path of the kubeconfig kube-scheduler talks to the apiserver with;
            ``None`` leaves ``clientConnection`` out (in-cluster config in a pod).
        scheduler_name: the single profile's ``schedulerName``.
        extender: the extender to register, or ``None`` for a plain scheduler.
        leader_elect: enable leader election; its lease is named after the profile so
            several schedulers can share one cluster.
        resource_namespace: namespace of the leader-election lease.
        client_qps: ``clientConnection.qps``, kube-scheduler's API request rate limit
            (requests/s; the chart's 100 by default, ``None`` leaves kube-scheduler's 50).
        client_burst: ``clientConnection.burst`` (requests; the chart's 200, ``None``:
            kube-scheduler's 100).

    Returns:
        A dict with ``apiVersion``, ``kind``, ``leaderElection``, ``profiles`` and, when
        given, ``clientConnection`` and ``extenders``.
    """
    doc: dict[str, Any] = {
        "apiVersion": SCHEDULER_CONFIG_API_VERSION,
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": leader_elect},
        "profiles": [{"schedulerName": scheduler_name}],
    }
    if leader_elect:
        doc["leaderElection"].update(
            {"resourceName": scheduler_name, "resourceNamespace": resource_namespace}
        )
    connection: dict[str, Any] = {}
    if kubeconfig is not None:
        connection["kubeconfig"] = kubeconfig
    if client_qps is not None:
        connection["qps"] = client_qps
    if client_burst is not None:
        connection["burst"] = client_burst
    if connection:
        doc["clientConnection"] = connection
    if extender is not None:
        doc["extenders"] = [extender.to_dict()]
    return doc
