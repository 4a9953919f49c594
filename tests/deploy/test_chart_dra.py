"""The chart in DRA mode (``dra.enabled``): the DRA plugin DaemonSet with the monitor, the
DeviceClass, the scheduler's ``--dra-mode`` and prioritize-only extender, and the guard
that keeps the device plugin and the DRA plugin off each other's nodes (docs/dra.md)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.chart import (
    CHART,
    CI_VALUES,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    container,
    find,
    helm,
    render,
    scheduler_config,
)

pytestmark = pytest.mark.usefixtures("require_helm")

DRA_VALUES = CI_VALUES / "dra-values.yaml"


@pytest.fixture(scope="module")
def dra() -> list[dict[str, Any]]:
    return render(files=[DRA_VALUES])


def _volumes(pod: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: (v.get("hostPath") or {}).get("path", "") for v in pod["volumes"]}


def _mounts(c: dict[str, Any], pod: dict[str, Any]) -> dict[str, str]:
    """mountPath -> host path (or volume name when not a hostPath)."""
    host = _volumes(pod)
    return {m["mountPath"]: host.get(m["name"]) or m["name"] for m in c["volumeMounts"]}


def test_default_renders_no_dra_objects() -> None:
    objs = render()
    assert not [o for o in objs if o["kind"] == "DeviceClass"
                or "dra" in o["metadata"]["name"]]
    ext = container(find(objs, "Deployment", "hami-scheduler")["spec"]["template"]["spec"],
                    "vgpu-scheduler-extender")
    assert "--dra-mode" not in ext["args"]


def test_dra_plugin_daemonset(dra: list[dict[str, Any]]) -> None:
    """hami dra-plugin on the DRA nodes, with the kubelet's plugin directories, the CDI
    directory and the vgpu directory; the monitor sees the whole vgpu directory (claims/)."""
    ds = find(dra, "DaemonSet", "hami-dra-plugin")
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "hami-dra-plugin"
    assert pod["nodeSelector"] == {"gpu": "dra"} and pod["hostPID"] is True
    plugin = container(pod, "dra-plugin")
    assert plugin["command"] == ["hami", "dra-plugin"]
    assert {"--registry-dir=/var/lib/kubelet/plugins_registry",
            "--plugin-dir=/var/lib/kubelet/plugins/gpu.hami.io", "--cdi-dir=/var/run/cdi",
            "--device-config-file=/device-config.yaml",
            "--node-config-file=/config/config.json"} <= set(plugin["args"])
    env = {e["name"]: e for e in plugin["env"]}
    assert env["HOOK_PATH"]["value"] == "/usr/local"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = _mounts(plugin, pod)
    for path in ("/usr/local/vgpu", "/var/lib/kubelet/plugins_registry",
                 "/var/lib/kubelet/plugins/gpu.hami.io", "/var/run/cdi"):
        assert mounts[path] == path, path  # host path = container path (CDI specs name it)
    monitor = container(pod, "vgpu-monitor")
    assert monitor["command"] == ["hami", "monitor"]
    assert {e["name"]: e.get("value") for e in monitor["env"]}["HOOK_PATH"] == "/usr/local/vgpu"
    assert _mounts(monitor, pod)["/usr/local/vgpu"] == "/usr/local/vgpu"
    install = container(pod, "install-libvgpu", init=True)
    assert "--install-lib=/usr/local/vgpu" in install["args"]
    for c in (plugin, monitor):
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # the node overrides the DRA plugin reads exist even without the device plugin
    alone = render({"dra": {"enabled": True}, "devicePlugin": {"enabled": False}})
    find(alone, "ConfigMap", "hami-device-plugin-config")
    assert not [o for o in alone if o["kind"] == "DaemonSet"
                and o["metadata"]["name"] == "hami-device-plugin"]


def test_paths_follow_the_values() -> None:
    objs = render({"dra": {"enabled": True, "kubeletDir": "/data/kubelet/",
                           "cdiSpecDir": "/etc/cdi", "monitor": {"enabled": False}},
                   "devicePlugin": {"enabled": False}, "global": {"gpuHookPath": "/opt/h"}})
    pod = find(objs, "DaemonSet", "hami-dra-plugin")["spec"]["template"]["spec"]
    plugin = container(pod, "dra-plugin")
    assert {"--registry-dir=/data/kubelet/plugins_registry",
            "--plugin-dir=/data/kubelet/plugins/gpu.hami.io",
            "--cdi-dir=/etc/cdi"} <= set(plugin["args"])
    assert set(_mounts(plugin, pod)) >= {"/opt/h/vgpu", "/etc/cdi",
                                          "/data/kubelet/plugins_registry"}
    assert [c["name"] for c in pod["containers"]] == ["dra-plugin"]
    policy = find(objs, "NetworkPolicy", "hami-dra-plugin")
    assert policy["spec"]["ingress"] == []


def test_device_class_is_the_one_the_webhook_names(dra: list[dict[str, Any]]) -> None:
    from hami.dra.slices import DRIVER
    from hami.dra.translate import DEVICE_CLASS

    dc = find(dra, "DeviceClass")
    assert dc["apiVersion"] == "resource.k8s.io/v1"
    assert dc["metadata"]["name"] == DEVICE_CLASS
    assert dc["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]


def test_scheduler_runs_dra_mode_with_a_prioritize_only_extender(
        dra: list[dict[str, Any]]) -> None:
    """The webhook in DRA mode; kube-scheduler calls hami only to rank nodes: the same
    extender entry the DRA e2e test runs the real kube-scheduler with, over the chart's
    plain-HTTP loopback listener (scheduler.extenderLoopbackPort)."""
    sc = pytest.importorskip("hami.testing.scheduler_config")
    pod = find(dra, "Deployment", "hami-scheduler")["spec"]["template"]["spec"]
    assert "--dra-mode" in container(pod, "vgpu-scheduler-extender")["args"]
    cfg = scheduler_config(dra)
    (ext,) = cfg["extenders"]
    assert ext["prioritizeVerb"] == "prioritize"
    assert "filterVerb" not in ext and "bindVerb" not in ext
    ours = sc.render_scheduler_config(
        kubeconfig=None, extender=sc.ExtenderConfig(
            "http://127.0.0.1:9444", filter_verb=None, bind_verb=None,
            prioritize_verb="prioritize", managed_resources=(), enable_https=False),
        leader_elect=True, resource_namespace=NAMESPACE)
    assert cfg == ours


def test_the_webhook_checks_claims_and_templates_only_in_dra_mode(
        dra: list[dict[str, Any]]) -> None:
    """DRA mode: a second webhook sends ResourceClaim and ResourceClaimTemplate CREATEs to
    the same server, with the pod webhook's failure policy and namespace selection (their
    spec is immutable: no UPDATE); the templates hami's own account makes for a pod it
    has just checked are left out. It is a validating webhook (it sees the claim's UID,
    which hami records for the claims the resourceclaim controller makes). Without
    dra.enabled: only the pod webhook."""
    (pods,) = find(render(), "MutatingWebhookConfiguration")["webhooks"]
    assert pods["name"] == "vgpu.hami.io"
    assert not [o for o in render() if o["kind"] == "ValidatingWebhookConfiguration"]
    for policy in ("Fail", "Ignore"):
        objs = render({"scheduler": {"admissionWebhook": {"failurePolicy": policy}}},
                      files=[DRA_VALUES])
        (pods,) = find(objs, "MutatingWebhookConfiguration")["webhooks"]
        validating = find(objs, "ValidatingWebhookConfiguration")
        assert validating["metadata"]["name"] == find(
            objs, "MutatingWebhookConfiguration")["metadata"]["name"]
        (claims,) = validating["webhooks"]
        assert claims["name"] == "claims.vgpu.hami.io"
        assert claims["failurePolicy"] == pods["failurePolicy"] == policy
        for same in ("clientConfig", "namespaceSelector", "timeoutSeconds",
                     "matchPolicy", "admissionReviewVersions"):
            assert claims[same] == pods[same], same
        # both only answer: the scheduler creates a pod's ResourceClaimTemplates from
        # its pod watch once the pod exists (a forged review creates nothing)
        assert pods["sideEffects"] == claims["sideEffects"] == "None"
    assert claims["rules"] == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                                "operations": ["CREATE"],
                                "resources": ["resourceclaims", "resourceclaimtemplates"],
                                "scope": "Namespaced"}]
    assert "reinvocationPolicy" not in claims
    # the resourceclaim controller's identities, as the scheduler is told them
    args = container(find(dra, "Deployment", "hami-scheduler")["spec"]["template"]["spec"],
                     "vgpu-scheduler-extender")["args"]
    assert ("--dra-trusted-claim-creators=system:serviceaccount:kube-system:"
            "resource-claim-controller,system:kube-controller-manager") in args
    (cond,) = claims["matchConditions"]
    account = find(dra, "Deployment", "hami-scheduler")["spec"]["template"]["spec"][
        "serviceAccountName"]
    assert cond["expression"].strip() == (
        f'request.userInfo.username != "system:serviceaccount:{NAMESPACE}:{account}"')


def test_dra_plugin_metrics_reach_only_scrapers(dra: list[dict[str, Any]]) -> None:
    policy = find(dra, "NetworkPolicy", "hami-dra-plugin")
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == \
        "hami-dra-plugin"
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {
        "hami.io/metrics-scraper": "true"}}}]


@pytest.mark.parametrize("values", [
    {"dra": {"enabled": True, "nodeSelector": {"gpu": "on"}}},          # the same node
    # (null removes a default key: helm merges maps)
    {"dra": {"enabled": True, "nodeSelector": {"gpu": None, "gpu-dra": "true"}}},  # may meet
    {"dra": {"enabled": True, "nodeSelector": {"gpu": None}}},          # every node
    {"dra": {"enabled": True}, "devicePlugin": {"nvidiaNodeSelector": {"gpu": None}}},
])
def test_device_plugin_and_dra_plugin_never_share_a_node(values: dict[str, Any]) -> None:
    """A node both DaemonSets could select would have its cards booked twice: rendering
    fails with the reason."""
    proc = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--kube-version", KUBE_VERSION, "--set-json", f"dra={_json(values['dra'])}",
                *(["--set-json", f"devicePlugin={_json(values['devicePlugin'])}"]
                  if "devicePlugin" in values else []))
    assert proc.returncode != 0
    assert "could select the same node" in proc.stderr and "booked twice" in proc.stderr


@pytest.mark.parametrize("values", [
    {"dra": {"enabled": True}},                                         # gpu=dra vs gpu=on
    {"dra": {"enabled": True, "nodeSelector": {"gpu": "on"}}, "devicePlugin": {"enabled": False}},
    {"dra": {"enabled": True, "nodeSelector": {"gpu": None, "pool": "a", "zone": "x"}},
     "devicePlugin": {"nvidiaNodeSelector": {"gpu": None, "pool": "b"}}},
])
def test_disjoint_or_single_node_agents_render(values: dict[str, Any]) -> None:
    objs = render(values)
    find(objs, "DaemonSet", "hami-dra-plugin")


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def test_dra_monitor_honours_priority_0_only_where_granted() -> None:
    objs = render({"dra": {"enabled": True}, "devicePlugin": {"enabled": False},
                   "scheduler": {"highPriorityNamespaces": ["inference"]}})
    pod = find(objs, "DaemonSet", "hami-dra-plugin")["spec"]["template"]["spec"]
    assert "--high-priority-namespaces=inference" in container(pod, "vgpu-monitor")["args"]
