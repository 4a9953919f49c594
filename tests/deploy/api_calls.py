"""Every Kubernetes API call hami's in-cluster components make, read off the code.

The chart's RBAC is checked against this table in both directions
(``tests/deploy/test_rbac.py``: every call is allowed, every granted verb is some call's),
the table against the code (every API-layer method is in it, and only the API-layer
modules talk to the apiserver), and against what the real components do on the real
apiserver (``tests/deploy/e2e/test_full_chain.py`` reads the audit log).

A call names the object it touches when the code always touches the same one (``name``:
a key of :func:`chart_names`); ``scope`` is ``"cluster"`` for cluster-scoped objects and
calls in any namespace, ``"release"`` for calls in the release namespace only; ``when``
is the chart setting that makes the component make the call (``None``: always).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Components (one ServiceAccount each in the chart).
SCHEDULER, DEVICE_PLUGIN, KUBE_SCHEDULER = "hami-scheduler", "hami-device-plugin", "kube-scheduler"
DRA_PLUGIN = "hami-dra-plugin"


@dataclass(frozen=True)
class Call:
    """One kind of request: RBAC ``verb`` on ``resource`` (``pods/binding`` for a
    subresource) of API ``group``."""

    verb: str
    resource: str
    group: str = ""
    scope: str = "cluster"
    name: str | None = None
    when: str | None = None
    where: tuple[str, ...] = ()


_KUBE = "hami.kube:Kube"
_NODE = "hami.deviceplugin.kube:KubeApi"
_DRA = "resource.k8s.io"
_AGENT = "hami.dra.node:DraAgent"
_AUTHN, _AUTHZ = "authentication.k8s.io", "authorization.k8s.io"

CALLS: dict[str, tuple[Call, ...]] = {
    # hami scheduler (extender, webhook) and its certgen init step
    SCHEDULER: (
        # engine.resync / engine._watch: the node, pod and quota caches
        Call("list", "nodes", where=(f"{_KUBE}.list",)),
        Call("watch", "nodes", where=(f"{_KUBE}.watch",)),
        Call("list", "pods", where=(f"{_KUBE}.list",)),
        Call("watch", "pods", where=(f"{_KUBE}.watch",)),
        Call("list", "resourcequotas", where=(f"{_KUBE}.list",)),
        Call("watch", "resourcequotas", where=(f"{_KUBE}.watch",)),
        # binder: the node lock; podcache / engine.bind: a pod the watch has not shown
        Call("get", "nodes", where=(f"{_KUBE}.get_node",)),
        Call("get", "pods", where=(f"{_KUBE}.get_pod",)),
        # engine: handshake annotations; binder: hami.io/mutex.lock
        Call("patch", "nodes", where=(f"{_KUBE}.patch_node",)),
        # filterflow: allocation annotations and bind-phase at filter (bindflow: bind-phase
        # for a charge from before a restart); engine: scheduler-role label
        Call("patch", "pods", where=(f"{_KUBE}.patch_pod",)),
        Call("create", "pods/binding", where=(f"{_KUBE}.bind",)),
        # events.EventSink: core/v1 Events in the pod's namespace
        Call("create", "events", where=(f"{_KUBE}.create_event",)),
        # preemptflow (on unless --no-preemption): evictions, nominatedNodeName, budgets
        Call("create", "pods/eviction", when="preemption", where=(f"{_KUBE}.evict",)),
        Call("patch", "pods/status", when="preemption", where=(f"{_KUBE}.patch_pod_status",)),
        Call("list", "poddisruptionbudgets", "policy", when="preemption",
             where=(f"{_KUBE}.list_pdbs",)),
        # election.LeaderElector.tick with --leader-elect-follow: read kube-scheduler's Lease
        Call("get", "leases", "coordination.k8s.io", scope="release", name="lease",
             when="leaderElect", where=(f"{_KUBE}.get_lease",)),
        # certgen: the TLS Secret and the webhook's caBundle
        Call("get", "secrets", scope="release", name="tls", when="certgen",
             where=("hami.certgen:_get_secret",)),
        Call("create", "secrets", scope="release", when="certgen",
             where=("hami.certgen:ensure_secret",)),
        Call("update", "secrets", scope="release", name="tls", when="certgen",
             where=("hami.certgen:ensure_secret",)),
        Call("get", "mutatingwebhookconfigurations", "admissionregistration.k8s.io",
             name="webhook", when="certgen-webhook", where=("hami.certgen:patch_ca_bundle",)),
        Call("patch", "mutatingwebhookconfigurations", "admissionregistration.k8s.io",
             name="webhook", when="certgen-webhook", where=("hami.certgen:patch_ca_bundle",)),
        Call("get", "validatingwebhookconfigurations", "admissionregistration.k8s.io",
             name="webhook", when="certgen-webhook", where=("hami.certgen:patch_ca_bundle",)),
        Call("patch", "validatingwebhookconfigurations", "admissionregistration.k8s.io",
             name="webhook", when="certgen-webhook", where=("hami.certgen:patch_ca_bundle",)),
        # DRA mode (--dra-mode): the templates of admitted pods (the reconciler follows
        # the pod watch above); the watched slices and claims (/prioritize, quota, card
        # sizes) and the listings before the watch has synced
        # (and once at start-up before 1.37 a dry-run one in the release namespace:
        # prioritized lists on? hami.dra.startup.template_refusal)
        Call("create", "resourceclaimtemplates", _DRA, when="dra",
             where=("hami.dra.templates:TemplateReconciler.reconcile",
                    "hami.dra.startup:template_refusal")),
        # a template of hami's name made by someone else (webhook and reconciler); the
        # templates a pod names itself (quota-limited namespaces)
        Call("get", "resourceclaimtemplates", _DRA, when="dra",
             where=("hami.dra.templates:read_template",)),
        Call("list", "resourceslices", _DRA, when="dra",
             where=("hami.dra.cache:DraObjects._run", "hami.dra.quotaview:QuotaView.published",
                    "hami.dra.quotaview:QuotaView.published_devices",
                    "hami.dra.cache:DraObjects.published_devices",
                    "hami.dra.prioritize:DraPrioritizer.__call__")),
        Call("watch", "resourceslices", _DRA, when="dra", where=("hami.dra.cache:DraObjects._run",)),
        Call("list", "resourceclaims", _DRA, when="dra",
             where=("hami.dra.cache:DraObjects._run", "hami.dra.quotaview:QuotaView.namespace_ledger",
                    "hami.dra.prioritize:DraPrioritizer.__call__")),
        Call("watch", "resourceclaims", _DRA, when="dra", where=("hami.dra.cache:DraObjects._run",)),
        # a claim a pod names itself: does it ask hami's DeviceClass (isolation rules)
        Call("get", "resourceclaims", _DRA, when="dra", where=("hami.dra.templates:read_claim",)),
        # secure metrics (--metrics-secure): who is scraping, may they get /metrics
        Call("create", "tokenreviews", _AUTHN, when="metrics-secure",
             where=(f"{_KUBE}.review_token",)),
        Call("create", "subjectaccessreviews", _AUTHZ, when="metrics-secure",
             where=(f"{_KUBE}.review_access",)),
        # the collector of templates no pod needs (label hami.io/dra-template, all namespaces)
        Call("list", "resourceclaimtemplates", _DRA, when="dra",
             where=("hami.dra.templategc:TemplateCollector.sweep",)),
        Call("delete", "resourceclaimtemplates", _DRA, when="dra",
             where=("hami.dra.templategc:TemplateCollector.sweep",)),
        # the namespace quota's reservations across replicas: hami-dra-quota-<namespace>
        Call("get", "leases", "coordination.k8s.io", scope="release", when="dra",
             where=("hami.dra.reservations:QuotaReservations._lease",
                    "hami.dra.reservations:QuotaReservations.records")),
        # the pods whose claims the resourceclaim controller made (hami.dra.podclaims)
        Call("list", "pods", when="dra",
             where=("hami.dra.quotaview:QuotaView.namespace_ledger",)),
        Call("create", "leases", "coordination.k8s.io", scope="release", when="dra",
             where=("hami.dra.reservations:QuotaReservations._lease",)),
        Call("update", "leases", "coordination.k8s.io", scope="release", when="dra",
             where=("hami.dra.reservations:QuotaReservations.reserve",)),
    ),
    # device plugin and monitor
    DEVICE_PLUGIN: (
        Call("get", "nodes", where=(f"{_NODE}.get_node_annotations", f"{_NODE}.node_annotations",
                                     f"{_NODE}.release_node_lock", f"{_NODE}.node_versions")),
        # NodeWatch.run: fieldSelector metadata.name=<its node>
        Call("watch", "nodes", where=(f"{_NODE}.start_node_watch",
                                      "hami.deviceplugin.kubewatch:NodeWatch.run")),
        Call("patch", "nodes", where=(f"{_NODE}.patch_node_annotations",
                                      f"{_NODE}.release_node_lock")),
        Call("get", "pods", where=(f"{_NODE}.get_pod",)),
        # fieldSelector spec.nodeName=<its node> (Allocate, MIG, the monitor; Allocate's
        # PodWatch and its fallback add status.phase=Pending)
        Call("list", "pods", where=(f"{_NODE}.pods_on_node", f"{_NODE}.pods_labelled_for",
                                     f"{_NODE}.pending_pods_on_node", f"{_NODE}.pending_pods",
                                     "hami.deviceplugin.kubewatch:PodWatch.run")),
        # PodWatch.run: the Pending pods of its node (fieldSelector as the list above)
        Call("watch", "pods", where=(f"{_NODE}.start_pod_watch",
                                     "hami.deviceplugin.kubewatch:PodWatch.run")),
        Call("patch", "pods", where=(f"{_NODE}.patch_pod_annotations",)),
        # the monitor's secure metrics (--metrics-secure)
        Call("create", "tokenreviews", _AUTHN, when="monitor-metrics-secure",
             where=(f"{_NODE}.review_token",)),
        Call("create", "subjectaccessreviews", _AUTHZ, when="monitor-metrics-secure",
             where=(f"{_NODE}.review_access",)),
    ),
    # DRA mode's node agent (hami dra-plugin) and its monitor
    DRA_PLUGIN: (
        # SlicePublisher.sync: the node's slices (fieldSelector spec.nodeName, spec.driver),
        # created or replaced when they changed
        Call("list", "resourceslices", _DRA, where=("hami.dra.node:SlicePublisher.sync",
                                                    f"{_AGENT}.publish_loop")),
        # ... and once at start-up a dry-run one (hami.dra.startup: consumable capacity on?)
        Call("create", "resourceslices", _DRA, where=("hami.dra.node:SlicePublisher.sync",
                                                      "hami.dra.startup:refusal")),
        Call("update", "resourceslices", _DRA, where=("hami.dra.node:SlicePublisher.sync",)),
        # NodePrepareResources: the claim's allocation; the owner record: its pods
        Call("get", "resourceclaims", _DRA, where=(f"{_AGENT}.get_claim",)),
        Call("get", "pods", where=(f"{_AGENT}.get_pod",)),
        # the Node: its UID (the slice's owner) and its hami.io/device-cordon, watched
        # (metadata.name field selector); a GET while the watch (re)connects
        Call("watch", "nodes", where=("hami.dra.node:NodeCordonWatch.run",)),
        Call("get", "nodes", where=("hami.dra.node:SlicePublisher.sync",
                                    "hami.dra.node:SlicePublisher.cordoned")),
        # the monitor: the pods of its node (fieldSelector spec.nodeName)
        Call("list", "pods", when="dra-monitor", where=(f"{_NODE}.pods_on_node",)),
        Call("create", "tokenreviews", _AUTHN, when="dra-monitor-metrics-secure",
             where=(f"{_NODE}.review_token",)),
        Call("create", "subjectaccessreviews", _AUTHZ, when="dra-monitor-metrics-secure",
             where=(f"{_NODE}.review_access",)),
    ),
    # kube-scheduler: its leader Lease, which the built-in system:kube-scheduler role does
    # not cover by name (that role grants the rest, including the Lease's create).
    KUBE_SCHEDULER: (
        Call("get", "leases", "coordination.k8s.io", scope="release", name="lease",
             when="leaderElect"),
        Call("update", "leases", "coordination.k8s.io", scope="release", name="lease",
             when="leaderElect"),
    ),
}

#: Methods of the API layer whose calls the chart's components never make, and why.
NOT_IN_CHART = {
    f"{_KUBE}.create_lease": "own leader election; the chart runs --leader-elect-follow",
    f"{_KUBE}.replace_lease": "own leader election; the chart runs --leader-elect-follow",
    f"{_KUBE}.close": "no request",
    f"{_KUBE}.connect": "no request",
    "hami.certgen:ensure_allocation_key": "an admin rotates the allocation key with "
                                          "`hami certgen` and their own credentials",
    "hami.deviceplugin.kubewatch:NodeWatch.get": "no request: the watched copy",
    "hami.deviceplugin.kubewatch:NodeWatch.offer": "no request: the watched copy",
    "hami.deviceplugin.kubewatch:PodWatch.pods": "no request: the watched copy",
    "hami.deviceplugin.kubewatch:PodWatch.offer": "no request: the watched copy",
    "hami.dra.node:NodeCordonWatch.get": "no request: the watched copy",
    "hami.dra.node:SlicePublisher.invalidate": "no request",
    "hami.dra.templates:TemplateReconciler.observe": "no request: starts reconcile",
    "hami.dra.templates:TemplateReconciler.stop": "no request",
    "hami.dra.reservations:QuotaReservations.lease_name": "no request",
    "hami.dra.templategc:TemplateCollector.observe": "no request: the pod watch",
    "hami.dra.templategc:TemplateCollector.in_use": "no request",
    "hami.dra.templategc:TemplateCollector.relisted": "no request: the pod relist",
    "hami.dra.templategc:TemplateCollector.start": "no request: starts sweep",
    "hami.dra.templategc:TemplateCollector.stop": "no request",
    "hami.dra.templates:TemplateReconciler.forget": "no request",
    f"{_AGENT}.devices": "no request: discovery",
    f"{_AGENT}.uuids": "no request: discovery",
    f"{_AGENT}.health_loop": "no request: NVML health events",
    "hami.dra.cache:DraObjects.shared": "no request: starts the watches (_run)",
    "hami.dra.cache:DraObjects.start": "no request: starts the watches (_run)",
    "hami.dra.cache:DraObjects.stop": "no request",
    "hami.dra.cache:DraObjects.apply": "no request: the watched copy",
    "hami.dra.cache:DraObjects.memory_use": "no request: the watched copy",
    "hami.dra.cache:DraObjects.claims_in": "no request: the watched copy",
    "hami.dra.cache:DraObjects.card_sizes_mib": "no request: the watched copy",
    "hami.dra.cache:DraObjects.metric_rows": "no request: the watched copy",
    f"{_AGENT}.claim_mig": "no request: the node's MIG driver",
    "hami.dra.cache:DraObjects.mig_offers": "no request: the watched copy",
}

#: The API layer: the only modules that import lightkube (besides ``hami top``, which runs
#: with the user's own kubeconfig, and the test helpers).
API_MODULES = {"hami.kube": ("Kube",), "hami.deviceplugin.kube": ("KubeApi",),
               "hami.deviceplugin.kubewatch": ("NodeWatch", "PodWatch"),
               "hami.certgen": (), "hami.dra.node": ("SlicePublisher", "DraAgent", "NodeCordonWatch"),
               "hami.dra.cache": ("DraObjects",), "hami.dra.webhook": ("DraWebhook",),
               "hami.dra.quotaview": ("QuotaView",),
               "hami.dra.templates": ("TemplateReconciler",),
               "hami.dra.prioritize": ("DraPrioritizer",),
               "hami.dra.namedclaims": (),  # reads through DraWebhook; handles ApiError
               "hami.dra.reservations": ("QuotaReservations",),
               "hami.dra.templategc": ("TemplateCollector",), "hami.dra.startup": ()}
#: Non-resource GETs at start-up (hami.clusterprobe: the scheduler and the DRA plugin read
#: the server's version and APIs); every authenticated user may (the built-in
#: system:discovery and system:public-info-viewer roles), so no chart RBAC is involved.
DISCOVERY = ("/version", "/api", "/apis")
OUTSIDE_CHART = {"hami.top": "hami top runs with the user's kubeconfig (list nodes, pods, "
                             "resourcequotas, resourceslices, resourceclaims)",
                 "hami.kubehttp": "builds the API layer's HTTP transports (keepalive, watch "
                                  "idle deadline); makes no request itself",
                 "hami.kubehint": "loads the kubeconfig file for the API layer (lightkube's "
                                  "KubeConfig, one-line errors); makes no request itself"}


def chart_names(objs: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The objects the calls name, as the rendered chart configures the code: ``lease``
    (kube-scheduler's leader Lease, which the hami scheduler follows), ``tls`` (certgen's
    Secret), ``webhook`` (the MutatingWebhookConfiguration certgen patches)."""
    out: dict[str, str] = {}
    for arg in _args(objs, "vgpu-scheduler-extender"):
        if arg.startswith("--leader-elect-resource-name="):
            out["lease"] = arg.split("=", 1)[1]
    for arg in _args(objs, "certgen", init=True):
        if arg.startswith("--secret="):
            out["tls"] = arg.split("=", 1)[1]
        if arg.startswith("--webhook="):
            out["webhook"] = arg.split("=", 1)[1]
    return out


def chart_settings(objs: Sequence[Mapping[str, Any]]) -> set[str]:
    """The ``when`` conditions the rendered chart meets."""
    out = set()
    extender = _args(objs, "vgpu-scheduler-extender")
    if "--leader-elect" in extender:
        assert "--leader-elect-follow" in extender, "the table assumes the follow mode"
        out.add("leaderElect")
    if "--dra-mode" in extender:
        out.add("dra")
    if extender and "--no-preemption" not in extender:
        out.add("preemption")
    if any(c["name"] == "vgpu-monitor" for c in _pod_containers(objs, "DaemonSet",
                                                                "hami-dra-plugin")):
        out.add("dra-monitor")
    if "--metrics-secure" in extender:
        out.add("metrics-secure")
    for component, prefix in (("hami-device-plugin", "monitor"), ("hami-dra-plugin", "dra-monitor")):
        for c in _pod_containers(objs, "DaemonSet", component):
            if c["name"] == "vgpu-monitor" and "--metrics-secure" in (c.get("args") or []):
                out.add(f"{prefix}-metrics-secure")
    certgen = _args(objs, "certgen", init=True)
    if certgen:
        out.add("certgen")
        if any(a.startswith("--webhook=") for a in certgen):
            out.add("certgen-webhook")
    return out


def active(component: str, objs: Sequence[Mapping[str, Any]]) -> list[Call]:
    """The calls ``component`` makes with this rendered chart."""
    settings = chart_settings(objs)
    return [c for c in CALLS[component] if c.when is None or c.when in settings]


def _args(objs: Sequence[Mapping[str, Any]], container: str, *, init: bool = False) -> list[str]:
    for obj in objs:
        if obj["kind"] != "Deployment":
            continue
        spec = obj["spec"]["template"]["spec"]
        for c in spec.get("initContainers" if init else "containers") or []:
            if c["name"] == container:
                return [str(a) for a in c.get("args") or []]
    return []


def _pod_containers(objs: Sequence[Mapping[str, Any]], kind: str,
                    component: str) -> list[Mapping[str, Any]]:
    """The containers of the ``kind`` object of ``component`` (its component label)."""
    for obj in objs:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if obj["kind"] == kind and labels.get("app.kubernetes.io/component") == component:
            return list(obj["spec"]["template"]["spec"].get("containers") or [])
    return []
