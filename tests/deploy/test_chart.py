"""The helm chart: lint, and what `helm template` renders for default and other values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    container,
    find,
    helm,
    render,
    scheduler_config,
)

pytestmark = pytest.mark.usefixtures("require_helm")




@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def ha() -> list[dict[str, Any]]:
    return render(files=[CI_VALUES / "ha-certmanager-values.yaml"])


@pytest.fixture(scope="module")
def minimal() -> list[dict[str, Any]]:
    return render(files=[CI_VALUES / "minimal-values.yaml"])


@pytest.mark.parametrize("values", [None, *sorted(p.name for p in CI_VALUES.glob("*.yaml"))])
def test_helm_lint_strict(values: str | None) -> None:
    args = ["lint", str(CHART), "--strict", "--kube-version", "v1.37.2", "-n", NAMESPACE]
    if values:
        args += ["-f", str(CI_VALUES / values)]
    proc = helm(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_default_objects(default: list[dict[str, Any]]) -> None:
    names = {(o["kind"], o["metadata"]["name"]) for o in default}
    assert names == {
        ("ServiceAccount", "hami-scheduler"), ("ServiceAccount", "hami-device-plugin"),
        ("ServiceAccount", "hami-kube-scheduler"), ("Secret", "hami-kube-scheduler-token"),
        ("ConfigMap", "hami-scheduler-config"), ("ConfigMap", "hami-scheduler-device"),
        ("ConfigMap", "hami-device-plugin-config"),
        ("ClusterRole", "hami-scheduler"), ("ClusterRole", "hami-device-plugin"),
        ("ClusterRoleBinding", "hami-scheduler"), ("ClusterRoleBinding", "hami-device-plugin"),
        ("ClusterRoleBinding", "hami-scheduler-kube-scheduler"),
        ("ClusterRoleBinding", "hami-scheduler-volume-scheduler"),
        ("Role", "hami-scheduler"), ("RoleBinding", "hami-scheduler"),
        ("Role", "hami-scheduler-kube-scheduler"), ("RoleBinding", "hami-scheduler-kube-scheduler"),
        ("RoleBinding", "hami-scheduler-auth-reader"),
        ("Service", "hami-scheduler"), ("Service", "hami-device-plugin-monitor"),
        ("Deployment", "hami-scheduler"), ("DaemonSet", "hami-device-plugin"),
        ("MutatingWebhookConfiguration", "hami-scheduler-webhook"),
        ("NetworkPolicy", "hami-scheduler"), ("Secret", "hami-allocation-key"),
        ("NetworkPolicy", "hami-device-plugin"),
        ("ValidatingAdmissionPolicy", "hami-allocations"),
        ("ValidatingAdmissionPolicyBinding", "hami-allocations"),
        ("ValidatingAdmissionPolicy", "hami-service-accounts"),
        ("ValidatingAdmissionPolicyBinding", "hami-service-accounts"),
        ("ValidatingAdmissionPolicy", "hami-scheduler-secrets"),
        ("ValidatingAdmissionPolicyBinding", "hami-scheduler-secrets"),
    }
    for obj in default:
        scoped = obj["kind"] not in ("ClusterRole", "ClusterRoleBinding",
                                     "MutatingWebhookConfiguration", "RuntimeClass",
                                     "ValidatingAdmissionPolicy",
                                     "ValidatingAdmissionPolicyBinding")
        ns = obj["metadata"].get("namespace")
        if obj["kind"] == "RoleBinding" and obj["metadata"]["name"].endswith("auth-reader"):
            assert ns == "kube-system"
        else:
            assert ns == (NAMESPACE if scoped else None), obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


def test_extender_loopback_port_zero_is_hamis_https_extender() -> None:
    objs = render({"scheduler": {"extenderLoopbackPort": 0}})
    (ext,) = scheduler_config(objs)["extenders"]
    assert ext["urlPrefix"] == "https://127.0.0.1:9443"
    assert ext["enableHTTPS"] is True and ext["tlsConfig"] == {"insecure": True}
    spec = find(objs, "Deployment", "hami-scheduler")["spec"]["template"]["spec"]
    args = container(spec, "vgpu-scheduler-extender")["args"]
    assert not [a for a in args if a.startswith("--extender-http-bind")]


def test_scheduler_config_is_the_hami_extender(default: list[dict[str, Any]]) -> None:
    cfg = scheduler_config(default)
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["profiles"] == [{"schedulerName": "hami-scheduler"}]
    assert cfg["leaderElection"] == {"leaderElect": True, "resourceName": "hami-scheduler",
                                     "resourceNamespace": NAMESPACE}
    (ext,) = cfg["extenders"]
    # kube-scheduler in the same pod: plain HTTP on loopback (no TLS handshake per bind)
    assert ext["urlPrefix"] == "http://127.0.0.1:9444"
    assert (ext["filterVerb"], ext["bindVerb"]) == ("filter", "bind")
    assert ext["nodeCacheCapable"] is True and ext["enableHTTPS"] is False
    assert "tlsConfig" not in ext
    assert ext["httpTimeout"] == "30s" and ext["weight"] == 1
    vendors = pytest.importorskip("hami.testing.scheduler_config").VENDOR_MANAGED_RESOURCES
    assert ext["managedResources"] == [
        {"name": n, "ignoredByScheduler": True}
        for n in ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
                  "nvidia.com/gpucores", "nvidia.com/priority", *vendors)]
    assert cfg["clientConnection"] == {"qps": 100, "burst": 200}


def test_every_resource_the_scheduler_manages_reaches_it(tmp_path: Path) -> None:
    """kube-scheduler calls the extender only for managedResources: the registry the hami
    scheduler builds from the chart's device config must not manage anything else, and a
    disabled vendor disappears from both."""
    from hami.settings import device_registry

    for values, gone in ((None, None), ({"devices": {"vendors": {"hygon": {"enabled": False}}}},
                                        "DCU")):
        objs = render(values)
        text = find(objs, "ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"]
        registry = device_registry(yaml.safe_load(text))
        ext = scheduler_config(objs)["extenders"][0]
        managed = {r["name"] for r in ext["managedResources"]}
        assert registry.resource_names() == managed
        words = set(registry)
        assert {"NVIDIA", "MLU", "Mthreads", "AMD", "AWSNeuron", "Metax-SGPU", "kunlun",
                "XPU", "Vastai", "Biren", "GCU", "Enflame"} <= words
        if gone:
            assert gone not in words and "hygon.com/dcunum" not in managed
        else:
            assert "DCU" in words


def test_mig_allowlist_reaches_the_device_plugin() -> None:
    """The chart's default allowlist parses in the plugin and gives spec 6.1's profiles,
    an H200 not taking the H20 entry."""
    from hami.deviceplugin.config import parse_mig_allowlist
    from hami.deviceplugin.migplan import allow_entry

    text = find(render(), "ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"]
    allow = parse_mig_allowlist(yaml.safe_load(text)["nvidia"]["migProfileAllowlist"])
    expect = {
        "NVIDIA A30": "1g.6gb,2g.12gb,4g.24gb",
        "NVIDIA A100-SXM4-40GB": "1g.5gb,2g.10gb,3g.20gb,7g.40gb",
        "NVIDIA A100-SXM4-80GB": "1g.10gb,2g.20gb,3g.40gb,7g.79gb",
        "NVIDIA H100 80GB HBM3": "1g.10gb,2g.20gb,3g.40gb,7g.80gb",
        "NVIDIA H100 NVL": "1g.12gb,2g.24gb,3g.47gb,7g.94gb",
        "NVIDIA H20": "1g.12gb,2g.24gb,3g.48gb,7g.96gb",
        "NVIDIA GH200 480GB": "1g.12gb,2g.24gb,3g.48gb,7g.96gb",
        "NVIDIA H200": "1g.18gb,2g.35gb,3g.71gb,7g.141gb",
        "NVIDIA B200": "1g.23gb,2g.45gb,3g.90gb,7g.180gb",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition": "1g.24gb,2g.48gb,4g.96gb",
    }
    for model, profiles in expect.items():
        entry = allow_entry(model, allow)
        assert entry is not None and ",".join(entry.profiles) == profiles, model
    assert allow_entry("Tesla T4", allow) is None


def test_scheduler_config_matches_the_test_control_plane(default: list[dict[str, Any]]) -> None:
    """The e2e control plane's renderer and the chart produce the same extender entry."""
    sc = pytest.importorskip("hami.testing.scheduler_config")
    cfg = scheduler_config(default)
    ours = sc.render_scheduler_config(
        kubeconfig=None,
        extender=sc.ExtenderConfig("http://127.0.0.1:9444", enable_https=False),
        leader_elect=True, resource_namespace=NAMESPACE)
    assert cfg == ours


def test_scheduler_deployment(default: list[dict[str, Any]]) -> None:
    dep = find(default, "Deployment", "hami-scheduler")
    spec = dep["spec"]["template"]["spec"]
    assert dep["spec"]["template"]["metadata"]["labels"]["hami.io/webhook"] == "ignore"
    ks = container(spec, "kube-scheduler")
    assert ks["image"] == "registry.k8s.io/kube-scheduler:v1.37.2"  # the cluster's version
    assert "--config=/config/config.yaml" in ks["args"]
    ext = container(spec, "vgpu-scheduler-extender")
    assert ext["command"] == ["hami", "scheduler"]
    args = ext["args"]
    for flag in ("--http_bind=0.0.0.0:9443", "--metrics-bind-address=:9395",
                 "--scheduler-name=hami-scheduler", "--device-config-file=/device-config.yaml",
                 "--cert_file=/tls/tls.crt", "--key_file=/tls/tls.key",
                 "--extender-http-bind=127.0.0.1:9444", "--leader-elect", "--leader-elect-follow",
                 "--leader-elect-resource-name=hami-scheduler",
                 f"--leader-elect-resource-namespace={NAMESPACE}"):
        assert flag in args
    env = {e["name"]: e for e in ext["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert {p["containerPort"] for p in ext["ports"]} == {9443, 9395}
    certgen = container(spec, "certgen", init=True)
    assert certgen["command"] == ["hami", "certgen"]
    assert "--webhook=hami-scheduler-webhook" in certgen["args"]
    for c in (ks, ext, certgen):
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert not any(o["kind"] == "PodDisruptionBudget" for o in default)  # one replica


def test_webhook_keeps_kube_system_safe(default: list[dict[str, Any]]) -> None:
    wh = find(default, "MutatingWebhookConfiguration")
    (hook,) = wh["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == 10 and hook["reinvocationPolicy"] == "Never"
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"},
                             {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                              "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"}]
    assert hook["clientConfig"]["service"] == {"name": "hami-scheduler", "namespace": NAMESPACE,
                                               "path": "/webhook", "port": 443}
    exprs = hook["namespaceSelector"]["matchExpressions"]
    assert {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]} in exprs
    excluded = next(e for e in exprs if e["key"] == "kubernetes.io/metadata.name")
    assert excluded["operator"] == "NotIn"
    assert {"kube-system", NAMESPACE} <= set(excluded["values"])


def test_webhook_selects_pods_by_namespace_never_by_their_own_labels(
        default: list[dict[str, Any]]) -> None:
    """Issue 12 §3: a pod labelled hami.io/webhook=ignore skipped the webhook. Only a
    namespace (or hami's own service accounts in its own namespace) is left out now."""
    (hook,) = find(default, "MutatingWebhookConfiguration")["webhooks"]
    assert "objectSelector" not in hook
    (cond,) = hook["matchConditions"]
    assert cond["expression"] == (
        f'!(request.namespace == "{NAMESPACE}" && object.spec.serviceAccountName in '
        '["hami-scheduler", "hami-device-plugin"])')
    spec = find(default, "Deployment", "hami-scheduler")["spec"]["template"]["spec"]
    ext = container(spec, "vgpu-scheduler-extender")
    assert "--gpu-hook-path=/usr/local" in ext["args"]
    assert not any(a.startswith("--other-gpu-schedulers") for a in ext["args"])
    other = render({"scheduler": {"otherGpuSchedulers": ["volcano", "kai"]},
                    "global": {"gpuHookPath": "/opt/hami"},
                    "devicePlugin": {"libPath": "/opt/hami/vgpu"}})
    args = container(find(other, "Deployment", "hami-scheduler")["spec"]["template"]["spec"],
                     "vgpu-scheduler-extender")["args"]
    assert "--other-gpu-schedulers=volcano,kai" in args and "--gpu-hook-path=/opt/hami" in args
    (floor,) = find(render(kube_version="v1.31.14"), "MutatingWebhookConfiguration")["webhooks"]
    assert floor["matchConditions"] and "objectSelector" not in floor  # GA in 1.30
    proc = helm("template", RELEASE, str(CHART), "--kube-version", "v1.37.2", "-n", NAMESPACE,
                "--set", "scheduler.admissionWebhook.objectSelector.matchLabels.a=b")
    assert proc.returncode != 0 and "objectSelector was removed" in proc.stderr


def test_priority_zero_is_granted_to_the_listed_namespaces_only(
        default: list[dict[str, Any]]) -> None:
    spec = find(default, "Deployment", "hami-scheduler")["spec"]["template"]["spec"]
    assert not any(a.startswith("--high-priority-namespaces")
                   for a in container(spec, "vgpu-scheduler-extender")["args"])
    granted = render({"scheduler": {"highPriorityNamespaces": ["inference", "serving"]}})
    args = container(find(granted, "Deployment", "hami-scheduler")["spec"]["template"]["spec"],
                     "vgpu-scheduler-extender")["args"]
    assert "--high-priority-namespaces=inference,serving" in args
    # the monitor honours priority 0 only there as well (a second line behind admission)
    monitor = container(find(granted, "DaemonSet", "hami-device-plugin")["spec"]["template"][
        "spec"], "vgpu-monitor")["args"]
    assert "--high-priority-namespaces=inference,serving" in monitor
    assert not any(a.startswith("--high-priority-namespaces") for a in container(
        find(default, "DaemonSet", "hami-device-plugin")["spec"]["template"]["spec"],
        "vgpu-monitor")["args"])


def test_device_plugin_daemonset(default: list[dict[str, Any]]) -> None:
    ds = find(default, "DaemonSet", "hami-device-plugin")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpu": "on"}
    assert spec["hostPID"] is True
    init = container(spec, "install-libvgpu", init=True)
    assert "--install-lib=/usr/local/vgpu" in init["args"]
    plugin = container(spec, "device-plugin")
    monitor = container(spec, "vgpu-monitor")
    assert plugin["command"] == ["hami", "device-plugin"]
    assert monitor["command"] == ["hami", "monitor"]
    assert "--metrics-bind-address=:9394" in monitor["args"]
    for c in (plugin, monitor):
        env = {e["name"]: e for e in c["env"]}
        assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert {e["name"]: e.get("value") for e in plugin["env"]}["HOOK_PATH"] == "/usr/local"
    assert {e["name"]: e.get("value") for e in monitor["env"]}["HOOK_PATH"] == "/usr/local/vgpu"
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host == {"device-plugin": "/var/lib/kubelet/device-plugins", "lib": "/usr/local/vgpu",
                    "tmp": "/tmp", "containers": "/usr/local/vgpu/containers",
                    "tmp-hami": "/tmp/hami",
                    # allocate mode auto (the default) may pick cdi: both are mounted
                    "pod-resources": "/var/lib/kubelet/pod-resources", "cdi-specs": "/var/run/cdi"}
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    assert mounts["device-plugin"] == "/var/lib/kubelet/device-plugins"
    assert mounts["lib"] == "/usr/local/vgpu" and mounts["tmp"] == "/tmp"
    assert mounts["node-config"] == "/config"
    assert {m["name"]: m["mountPath"] for m in monitor["volumeMounts"]}["containers"] == \
        "/usr/local/vgpu/containers"


def test_allocate_mode_auto_is_the_default() -> None:
    """The default install lets each node's plugin choose (``--allocate-mode=auto``), with
    what mode cdi needs mounted; ``node-lock`` renders HAMi's plugin (no flag, no mounts);
    ``cdi`` passes through; anything else fails the render."""
    def plugin_of(objs: list[dict[str, Any]]) -> tuple[list[str], dict[str, str]]:
        spec = find(objs, "DaemonSet", "hami-device-plugin")["spec"]["template"]["spec"]
        plugin = container(spec, "device-plugin")
        return plugin["args"], {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}

    args, mounts = plugin_of(render())
    assert "--allocate-mode=auto" in args
    assert "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in args
    assert "--cdi-spec-dir=/var/run/cdi" in args
    assert mounts["pod-resources"] == "/var/lib/kubelet/pod-resources"
    assert mounts["cdi-specs"] == "/var/run/cdi"
    args, mounts = plugin_of(render({"devicePlugin": {"allocateMode": "node-lock"}}))
    assert not [a for a in args if a.startswith(("--allocate-mode", "--pod-resources",
                                                 "--cdi-spec"))]
    assert "pod-resources" not in mounts and "cdi-specs" not in mounts
    args, _ = plugin_of(render({"devicePlugin": {"allocateMode": "cdi"}}))
    assert "--allocate-mode=cdi" in args
    proc = helm("template", RELEASE, str(CHART), "--kube-version", "v1.37.2",
                "--set", "devicePlugin.allocateMode=lockless")
    assert proc.returncode != 0 and "allocateMode" in proc.stderr


def test_device_config_loads_in_hami(default: list[dict[str, Any]], ha: list[dict[str, Any]],
                                     tmp_path: Path) -> None:
    from hami.settings import load_device_config

    for objs, expect in ((default, {"device_split_count": 10, "memory_factor": 1,
                                    "resource_memory_name": "nvidia.com/gpumem",
                                    "device_memory_scaling": 1.0, "default_gpu_num": 1}),
                         (ha, {"device_split_count": 4, "memory_factor": 1024,
                               "resource_memory_name": "nvidia.com/gpumemory",
                               "device_memory_scaling": 1.5, "default_memory_mib": 2048})):
        text = find(objs, "ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"]
        path = tmp_path / "device-config.yaml"
        path.write_text(text)
        cfg = load_device_config(path)
        for attr, value in expect.items():
            assert getattr(cfg, attr) == value, attr
        raw = yaml.safe_load(text)["nvidia"]
        assert {"deviceSplitCount", "deviceMemoryScaling", "deviceCoreScaling",
                "libCudaLogLevel"} <= set(raw)  # the plugin dereferences these


def test_node_overrides_configmap(default: list[dict[str, Any]]) -> None:
    import json

    cm = find(default, "ConfigMap", "hami-device-plugin-config")
    doc = json.loads(cm["data"]["config.json"])
    assert doc["nodeconfig"][0]["operatingmode"] == "hami-core"


def test_rbac_least_privilege(default: list[dict[str, Any]], ha: list[dict[str, Any]]) -> None:
    for objs in (default, ha):
        for role in (o for o in objs if o["kind"] in ("ClusterRole", "Role")):
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
                assert "delete" not in rule["verbs"] and "deletecollection" not in rule["verbs"]
                if "secrets" in rule["resources"]:
                    assert role["kind"] == "Role", "secrets only in the release namespace"
                    assert rule.get("resourceNames") or rule["verbs"] == ["create"]
                if "mutatingwebhookconfigurations" in rule["resources"]:
                    assert rule["resourceNames"] == ["hami-scheduler-webhook"]
    plugin = find(default, "ClusterRole", "hami-device-plugin")
    assert all("secrets" not in r["resources"] for r in plugin["rules"])
    assert not any(o["kind"] == "Role" and any("secrets" in r["resources"] for r in o["rules"])
                   for o in ha)  # cert-manager: certgen needs no Secret access


def test_services_and_ports(default: list[dict[str, Any]]) -> None:
    svc = find(default, "Service", "hami-scheduler")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == {
        "http": (443, "http"), "metrics": (9395, "metrics")}
    mon = find(default, "Service", "hami-device-plugin-monitor")
    assert mon["spec"]["type"] == "NodePort"
    (port,) = mon["spec"]["ports"]
    assert (port["port"], port["nodePort"], port["targetPort"]) == (9394, 31992, "metrics")


def test_network_policy_publishes_only_the_webhook_and_metrics(default: list[dict[str, Any]]) -> None:
    policy = find(default, "NetworkPolicy", "hami-scheduler")
    pod_labels = find(default, "Deployment", "hami-scheduler")["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector and all(pod_labels.get(k) == v for k, v in selector.items())
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert ports == ["http", "metrics"]
    # metrics name every GPU pod of every namespace: not open to the pod network by default
    default_from = [{"namespaceSelector": {"matchLabels": {"hami.io/metrics-scraper": "true"}}}]
    assert policy["spec"]["ingress"][1]["from"] == default_from
    plugin_policy = find(default, "NetworkPolicy", "hami-device-plugin")
    assert plugin_policy["spec"]["ingress"][0]["from"] == default_from
    assert "from" not in find(render({"networkPolicy": {"metricsFrom": []}}),
                              "NetworkPolicy", "hami-scheduler")["spec"]["ingress"][1]
    ext = container(find(default, "Deployment", "hami-scheduler")["spec"]["template"]["spec"],
                    "vgpu-scheduler-extender")
    assert "--extender-allow-remote" not in ext["args"]  # kube-scheduler is in the pod
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    scoped = find(render({"networkPolicy": {"metricsFrom": peers}}), "NetworkPolicy",
                  "hami-scheduler")
    assert scoped["spec"]["ingress"][1]["from"] == peers
    # the webhook port: open by default (the API server's address is not selectable),
    # narrowed to the listed peers with networkPolicy.webhookFrom
    assert "from" not in policy["spec"]["ingress"][0]
    control_plane = [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    narrowed = find(render({"networkPolicy": {"webhookFrom": control_plane}}),
                    "NetworkPolicy", "hami-scheduler")
    assert narrowed["spec"]["ingress"][0] == {
        "ports": [{"port": "http", "protocol": "TCP"}], "from": control_plane}
    assert "from" in narrowed["spec"]["ingress"][1]  # metrics keep their own peers
    assert not any(o["kind"] == "NetworkPolicy" for o in render({"networkPolicy": {"enabled": False}}))


def test_allocation_key_secret_reaches_the_scheduler(default: list[dict[str, Any]]) -> None:
    import base64

    secret = find(default, "Secret", "hami-allocation-key")
    assert len(base64.b64decode(secret["data"]["current"])) == 64
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    spec = find(default, "Deployment", "hami-scheduler")["spec"]["template"]["spec"]
    ext = container(spec, "vgpu-scheduler-extender")
    assert "--allocation-key-dir=/etc/hami/allocation-key" in ext["args"]
    mount = next(m for m in ext["volumeMounts"] if m["name"] == "allocation-key")
    assert mount["readOnly"] and mount["mountPath"] == "/etc/hami/allocation-key"
    volume = next(v for v in spec["volumes"] if v["name"] == "allocation-key")
    assert volume["secret"]["secretName"] == "hami-allocation-key"
    ds = find(default, "DaemonSet", "hami-device-plugin")["spec"]["template"]["spec"]
    plugin = container(ds, "device-plugin")
    assert "--allocation-key-dir=/etc/hami/allocation-key" in plugin["args"]
    assert "--scheduler-name=hami-scheduler" in plugin["args"]
    assert "--trust-unsigned-allocations" not in plugin["args"]
    assert any(m["name"] == "allocation-key" and m["readOnly"] for m in plugin["volumeMounts"])
    assert next(v for v in ds["volumes"] if v["name"] == "allocation-key")["secret"][
        "secretName"] == "hami-allocation-key"
    migrating = render({"allocationSigning": {"trustUnsignedAllocations": True}})
    args = container(find(migrating, "DaemonSet")["spec"]["template"]["spec"], "device-plugin")["args"]
    assert "--trust-unsigned-allocations" in args
    assert not any(a.startswith("--allocation-key-dir") for a in args)
    proc = helm("template", RELEASE, str(CHART), "-n", NAMESPACE,
                "--set", "allocationSigning.enabled=false")
    assert proc.returncode != 0 and "trustUnsignedAllocations=true" in proc.stderr
    off = render({"allocationSigning": {"enabled": False, "trustUnsignedAllocations": True}})
    assert "--trust-unsigned-allocations" in container(
        find(off, "DaemonSet")["spec"]["template"]["spec"], "device-plugin")["args"]
    assert not any(o["kind"] == "Secret" and o["metadata"]["name"] == "hami-allocation-key"
                   for o in off)
    ext_off = container(find(off, "Deployment", "hami-scheduler")["spec"]["template"]["spec"],
                        "vgpu-scheduler-extender")
    assert not any(a.startswith("--allocation-key-dir") for a in ext_off["args"])


def test_containers_without_gpu_are_hidden_from_gpus_by_default(tmp_path: Path) -> None:
    """The chart's default device config makes the webhook end every GPU-less container
    with NVIDIA_VISIBLE_DEVICES=none, even one that set it to all itself."""
    from hami.core.admission import admit
    from hami.settings import scheduler_config

    path = tmp_path / "device-config.yaml"
    path.write_text(find(render(), "ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"])
    config = scheduler_config(path, "binpack", "spread", "hami-scheduler")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "t"},
           "spec": {"containers": [{"name": "c", "image": "cuda",
                                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    env = admit(pod, config).pod["spec"]["containers"][0]["env"]
    assert env[-1] == {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} not in env


def test_outside_kube_scheduler_reaches_the_extender() -> None:
    objs = render({"scheduler": {"kubeScheduler": {"enabled": False}}})
    spec = find(objs, "Deployment", "hami-scheduler")["spec"]["template"]["spec"]
    assert "--extender-allow-remote" in container(spec, "vgpu-scheduler-extender")["args"]


def test_ha_certmanager_values(ha: list[dict[str, Any]]) -> None:
    dep = find(ha, "Deployment")
    assert dep["spec"]["replicas"] == 3
    pdb = find(ha, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    spec = dep["spec"]["template"]["spec"]
    assert "initContainers" not in spec  # cert-manager issues the certificate
    assert {"name": "regcred"} in spec["imagePullSecrets"]
    tls = next(v for v in spec["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == "hami-scheduler-tls"
    ext = container(spec, "vgpu-scheduler-extender")
    assert ext["image"] == "registry.example.com/hami/hami-scheduler:v9.9.9"
    for flag in ("--scheduler-name=gpu-scheduler", "--node-label-selector=gpu=on",
                 "--kube-timeout=20", "--node-lock-retry-timeout=10s"):
        assert flag in ext["args"]
    cfg = scheduler_config(ha)
    assert cfg["profiles"] == [{"schedulerName": "gpu-scheduler"}]
    (ext_cfg,) = cfg["extenders"]
    assert ext_cfg["httpTimeout"] == "45s"
    assert {"name": "nvidia.com/gpumemory", "ignoredByScheduler": True} in \
        ext_cfg["managedResources"]
    cert = find(ha, "Certificate")
    assert cert["spec"]["secretName"] == "hami-scheduler-tls"
    assert f"hami-scheduler.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    assert find(ha, "Issuer")["spec"] == {"selfSigned": {}}
    wh = find(ha, "MutatingWebhookConfiguration")
    assert wh["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
        f"{NAMESPACE}/hami-scheduler-serving-cert"
    (hook,) = wh["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    excluded = next(e for e in hook["namespaceSelector"]["matchExpressions"]
                    if e["key"] == "kubernetes.io/metadata.name")["values"]
    assert set(excluded) == {"kube-system", NAMESPACE, "istio-system", "monitoring"}
    monitors = sorted(o["metadata"]["name"] for o in ha if o["kind"] == "ServiceMonitor")
    assert monitors == ["hami-device-plugin-monitor", "hami-scheduler"]
    ds = find(ha, "DaemonSet")
    dspec = ds["spec"]["template"]["spec"]
    assert dspec["nodeSelector"] == {"accelerator": "nvidia"}
    assert dspec["runtimeClassName"] == "nvidia"
    assert find(ha, "RuntimeClass")["handler"] == "nvidia"
    host = {v["name"]: v["hostPath"]["path"] for v in dspec["volumes"] if "hostPath" in v}
    assert host["lib"] == "/opt/hami/vgpu" and host["containers"] == "/opt/hami/vgpu/containers"
    for obj in ha:
        assert obj["metadata"]["labels"]["team"] == "gpu"


def test_minimal_values(minimal: list[dict[str, Any]]) -> None:
    kinds = {o["kind"] for o in minimal}
    assert "MutatingWebhookConfiguration" not in kinds
    assert "PodDisruptionBudget" not in kinds
    dep = find(minimal, "Deployment")
    assert dep["spec"]["replicas"] == 1  # no leader election: never two schedulers
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    spec = dep["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    ext = container(spec, "vgpu-scheduler-extender")
    assert "livenessProbe" not in ext
    assert not any(a.startswith("--leader-elect") for a in ext["args"])
    assert scheduler_config(minimal)["leaderElection"] == {"leaderElect": False}
    ds = find(minimal, "DaemonSet")
    names = [c["name"] for c in ds["spec"]["template"]["spec"]["containers"]]
    assert names == ["device-plugin"]
    node_cfg = next(v for v in ds["spec"]["template"]["spec"]["volumes"]
                    if v["name"] == "node-config")
    assert node_cfg["configMap"]["name"] == "my-node-config"
    assert not any(o["kind"] == "ConfigMap" and o["metadata"]["name"] == "hami-device-plugin-config"
                   for o in minimal)
    assert "Service" in kinds and sum(o["kind"] == "Service" for o in minimal) == 1


def test_kube_scheduler_follows_cluster_version() -> None:
    objs = render(kube_version="v1.34.1")
    spec = find(objs, "Deployment")["spec"]["template"]["spec"]
    assert container(spec, "kube-scheduler")["image"] == "registry.k8s.io/kube-scheduler:v1.34.1"


def test_device_config_content_override() -> None:
    content = "nvidia:\n  resourceCountName: nvidia.com/vgpu\n  deviceSplitCount: 3\n" \
              "  deviceMemoryScaling: 1\n  deviceCoreScaling: 1\n  libCudaLogLevel: '1'\n"
    objs = render({"device-config": {"content": content}})
    text = find(objs, "ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"]
    assert yaml.safe_load(text) == yaml.safe_load(content)


# -- the chart's command lines are accepted by the real commands -----------------------------

def _command(sub: str) -> Any:
    """``hami <sub>`` as the container runs it: the real CLI's command (HAMi's flags,
    the old spellings and the common options included)."""
    import typer

    from hami.cli import app

    return typer.main.get_command(app).commands[sub]  # type: ignore[attr-defined]


@pytest.mark.parametrize("values", [None, *sorted(p.name for p in CI_VALUES.glob("*.yaml"))])
def test_chart_args_parse_with_the_real_commands(values: str | None) -> None:
    """Every `hami <cmd>` container of the chart passes its args to that command's parser."""
    objs = render(files=[CI_VALUES / values] if values else [])
    seen = set()
    for obj in objs:
        if obj["kind"] not in ("Deployment", "DaemonSet"):
            continue
        spec = obj["spec"]["template"]["spec"]
        for c in (spec.get("initContainers") or []) + spec["containers"]:
            if c.get("command", [None])[0] != "hami":
                continue
            sub = c["command"][1]
            seen.add(sub)
            cmd = _command(sub)
            ctx = cmd.make_context(f"hami {sub}", list(c.get("args") or []),
                                   resilient_parsing=False)
            assert ctx.params, sub
    assert seen >= {"device-plugin"}


def test_release_in_default_namespace_does_not_exclude_default() -> None:
    objs = render(namespace="default")
    (hook,) = find(objs, "MutatingWebhookConfiguration")["webhooks"]
    excluded = next(e for e in hook["namespaceSelector"]["matchExpressions"]
                    if e["key"] == "kubernetes.io/metadata.name")["values"]
    assert excluded == ["kube-system"]
    # hami's own pods are then left out by service account, which only pods of "default"
    # (hami's namespace, shared with no tenant) can name
    assert '!(request.namespace == "default" &&' in hook["matchConditions"][0]["expression"]


def test_lib_path_must_follow_the_hook_path() -> None:
    assert find(render({"devicePlugin": {"libPath": "/usr/local/vgpu"}}), "DaemonSet")
    proc = helm("template", RELEASE, str(CHART), "--kube-version", "v1.37.2",
                "--set", "devicePlugin.libPath=/opt/elsewhere")
    assert proc.returncode != 0 and "must be <global.gpuHookPath>/vgpu" in proc.stderr


def test_network_policy_lets_only_scrapers_reach_the_device_plugin(
        default: list[dict[str, Any]]) -> None:
    """Issue 12 §6: the monitor's per-pod metrics (every namespace's pods on the node) were
    open to the whole pod network; with networkPolicy.metricsFrom only the scrapers named
    there reach them, and nothing else reaches the device-plugin pods."""
    policy = find(default, "NetworkPolicy", "hami-device-plugin")
    pod = find(default, "DaemonSet", "hami-device-plugin")["spec"]["template"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector and all(pod["metadata"]["labels"].get(k) == v for k, v in selector.items())
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert "metrics" in [p["name"] for p in container(pod["spec"], "vgpu-monitor")["ports"]]
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    scoped = find(render({"networkPolicy": {"metricsFrom": peers}}), "NetworkPolicy",
                  "hami-device-plugin")
    assert scoped["spec"]["ingress"][0]["from"] == peers
    quiet = find(render({"devicePlugin": {"monitor": {"enabled": False}}}), "NetworkPolicy",
                 "hami-device-plugin")
    assert quiet["spec"]["ingress"] == []

