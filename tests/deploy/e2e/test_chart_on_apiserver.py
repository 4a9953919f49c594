"""The chart against the real kube-apiserver and kube-scheduler of the test control plane.

* every rendered manifest (default, HA + cert-manager + ServiceMonitors, minimal) passes a
  server-side dry run (CRDs of cert-manager and the Prometheus operator are stand-ins
  that accept any spec: the point is our objects, not theirs);
* kube-scheduler runs with the chart's own KubeSchedulerConfiguration (only the extender
  URL and the kubeconfig are swapped in) and places a GPU pod through the extender;
* ``hami certgen`` creates the Secret, patches the chart's webhook and keeps the cert.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, codecs
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Node, Pod, Secret

from hami.testing.controlplane import (
    HOST,
    ControlPlane,
    create_gpu_node,
    ensure_namespace,
    free_port,
    wait_until,
)
from hami.testing.gpupods import wait_webhook_serving
from tests.deploy.chart import CI_VALUES, NAMESPACE, find, render
from tests.e2e.recording_extender import RecordingExtender

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("require_helm")]

#: Stand-in CRDs: (group, version, kind, plural).
CRDS = [
    ("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors"),
    ("cert-manager.io", "v1", "Certificate", "certificates"),
    ("cert-manager.io", "v1", "Issuer", "issuers"),
]
VALUES = {
    "default": [],
    "ha-certmanager": [CI_VALUES / "ha-certmanager-values.yaml"],
    "minimal": [CI_VALUES / "minimal-values.yaml"],
    "dra": [CI_VALUES / "dra-values.yaml"],
}




@pytest.fixture(scope="module")
def prepared(kube_client: Any) -> Any:
    """The release namespace and the stand-in CRDs exist."""
    ensure_namespace(kube_client, NAMESPACE)
    for group, version, kind, plural in CRDS:
        crd = codecs.from_dict({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": version, "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {
                                       "type": "object",
                                       "x-kubernetes-preserve-unknown-fields": True}}}]}})
        try:
            kube_client.create(crd)
        except ApiError as err:
            if err.status.code != 409:
                raise
        create_namespaced_resource(group, version, kind, plural)

    def established(name: str) -> bool:
        conds = kube_client.get(CustomResourceDefinition, name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    for group, _v, _k, plural in CRDS:
        wait_until(lambda n=f"{plural}.{group}": established(n), timeout_s=30, what="CRD")
    return kube_client


@pytest.mark.parametrize("case", sorted(VALUES))
def test_every_manifest_passes_server_side_dry_run(prepared: Any, case: str) -> None:
    objs = render(files=VALUES[case], api_versions=["monitoring.coreos.com/v1",
                                                    "cert-manager.io/v1"])
    assert objs
    failures = []
    for doc in objs:
        obj = codecs.from_dict(doc)
        try:
            prepared.create(obj, dry_run=True)
        except ApiError as err:
            failures.append(f"{doc['kind']}/{doc['metadata']['name']}: {err.status.message}")
    assert not failures, "\n".join(failures)


# -- kube-scheduler on the chart's configuration ---------------------------------------------


def start_kube_scheduler(cp: ControlPlane, config: dict[str, Any],
                         workdir: Path) -> subprocess.Popen[bytes]:
    """Run the control plane's kube-scheduler binary on ``config`` until /readyz."""
    port = free_port()
    path = workdir / "chart-kube-scheduler.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = open(workdir / "chart-kube-scheduler.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(cp.binaries["kube-scheduler"]), f"--config={path}", f"--bind-address={HOST}",
         f"--secure-port={port}", f"--tls-cert-file={cp.pki_dir / 'serving.crt'}",
         f"--tls-private-key-file={cp.pki_dir / 'serving.key'}",
         f"--authentication-kubeconfig={cp.kubeconfig}",
         f"--authorization-kubeconfig={cp.kubeconfig}", "--v=2"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def alive() -> None:
        if proc.poll() is not None:
            raise AssertionError((workdir / "chart-kube-scheduler.log").read_text()[-3000:])

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"https://{HOST}:{port}/readyz", timeout=2,
                                        context=cp.ssl_context()) as resp:
                return bool(resp.status == 200)
        except (OSError, ValueError):
            return False

    wait_until(ready, timeout_s=90,
               what="kube-scheduler /readyz", alive=alive)
    return proc


@pytest.fixture
def chart_scheduler(prepared: Any, control_plane: ControlPlane,
                    tmp_path: Path) -> Iterator[RecordingExtender]:
    """kube-scheduler with the chart's KubeSchedulerConfiguration, extender = a recorder."""
    ext = RecordingExtender(control_plane.kubeconfig).start()
    # extenderLoopbackPort 0: kube-scheduler calls the extender over HTTPS (the recorder's)
    config = yaml.safe_load(find(render({"scheduler": {"extenderLoopbackPort": 0}}),
                                 "ConfigMap", "hami-scheduler-config")["data"]["config.yaml"])
    config["extenders"][0]["urlPrefix"] = ext.url
    config["clientConnection"] = {"kubeconfig": str(control_plane.kubeconfig)}
    proc = start_kube_scheduler(control_plane, config, tmp_path)
    try:
        yield ext
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        ext.stop()


def test_kube_scheduler_with_chart_config_places_gpu_pod(chart_scheduler: RecordingExtender,
                                                         kube_client: Any) -> None:
    node = f"chart-gpu-{uuid.uuid4().hex[:6]}"
    register = json.dumps([{"id": "GPU-chart-0", "count": 10, "devmem": 16384, "devcore": 100,
                            "type": "NVIDIA-T4", "mode": "hami-core", "health": True}])
    # nvidia.com/gpu capacity 0: with ignoredByScheduler kube-scheduler leaves the count to
    # the extender, so the pod still fits.
    create_gpu_node(kube_client, node, gpus=0, labels={"gpu": "on"},
                    annotations={"hami.io/node-nvidia-register": register})
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    pod = Pod(metadata=ObjectMeta(name=name, namespace="default"),
              spec=PodSpec(schedulerName="hami-scheduler", containers=[Container(
                  name="cuda", image="registry.k8s.io/pause:3.10",
                  resources=ResourceRequirements(limits={"nvidia.com/gpu": "1",
                                                         "nvidia.com/gpumem": "3000"}))]))
    kube_client.create(pod)
    try:
        wait_until(lambda: bool(kube_client.get(Pod, name, namespace="default").spec.nodeName),
                   timeout_s=60, what="pod bound")
        assert kube_client.get(Pod, name, namespace="default").spec.nodeName == node
        verbs = chart_scheduler.verbs()
        assert "filter" in verbs and "bind" in verbs
        filt = next(c.body for c in chart_scheduler.calls if c.verb == "filter")
        assert filt.get("NodeNames") and not filt.get("Nodes")  # nodeCacheCapable
    finally:
        kube_client.delete(Pod, name, namespace="default", grace_period=0)
        kube_client.delete(Node, node)


# -- certgen ------------------------------------------------------------------------------


def test_certgen_creates_secret_and_patches_webhook(prepared: Any, tmp_path: Path) -> None:
    from cryptography import x509

    from hami.certgen import ensure_secret, patch_ca_bundle, service_hosts, write_files

    objs = render()
    webhook = codecs.from_dict(find(objs, "MutatingWebhookConfiguration"))
    # The real object, not a dry run; it is deleted again below.
    prepared.create(webhook)
    try:
        hosts = service_hosts("hami-scheduler", NAMESPACE)
        bundle, action = ensure_secret(prepared, NAMESPACE, "hami-scheduler-tls", hosts)
        assert action == "created"
        again, action2 = ensure_secret(prepared, NAMESPACE, "hami-scheduler-tls", hosts)
        assert action2 == "kept" and again == bundle
        assert patch_ca_bundle(prepared, "hami-scheduler-webhook", bundle.ca_crt) == 1
        assert patch_ca_bundle(prepared, "hami-scheduler-webhook", bundle.ca_crt) == 0
        live = prepared.get(MutatingWebhookConfiguration, "hami-scheduler-webhook")
        assert base64.b64decode(live.webhooks[0].clientConfig.caBundle) == bundle.ca_crt
        secret = prepared.get(Secret, "hami-scheduler-tls", namespace=NAMESPACE)
        assert secret.type == "kubernetes.io/tls"
        cert = x509.load_pem_x509_certificate(bundle.tls_crt)
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(bundle.ca_crt))
        # A certificate that no longer covers the names is renewed in place.
        from hami.certgen import generate

        stale = prepared.get(Secret, "hami-scheduler-tls", namespace=NAMESPACE)
        stale.data = generate(["elsewhere.svc"]).to_secret_data()
        prepared.replace(stale)
        renewed, action3 = ensure_secret(prepared, NAMESPACE, "hami-scheduler-tls", hosts)
        assert action3 == "renewed" and renewed != bundle
        write_files(bundle, tmp_path / "tls")
        assert (tmp_path / "tls" / "tls.key").stat().st_mode & 0o777 == 0o600
        # A helm upgrade re-renders the webhook: the template keeps the live caBundle only
        # through lookup, which `helm template` cannot do; the patch step runs again on
        # every scheduler start, so the bundle comes back in any case.
    finally:
        prepared.delete(MutatingWebhookConfiguration, "hami-scheduler-webhook")
        prepared.delete(Secret, "hami-scheduler-tls", namespace=NAMESPACE)
        time.sleep(0.1)


def test_certgen_replicas_starting_together_share_one_secret(prepared: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from hami.certgen import ensure_secret, service_hosts

    hosts = service_hosts("hami-scheduler", NAMESPACE)
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: ensure_secret(prepared, NAMESPACE, "race-tls",
                                                            hosts), range(4)))
        assert len({r[0] for r in results}) == 1, [r[1] for r in results]
        assert sorted(r[1] for r in results).count("created") == 1
    finally:
        prepared.delete(Secret, "race-tls", namespace=NAMESPACE)


def test_certgen_rotates_the_allocation_key_in_two_steps(prepared: Any) -> None:
    """Created once, kept, then rotated through ``next`` on the real API server; the
    Secret always holds a ``current`` key and two replicas racing create one key."""
    from concurrent.futures import ThreadPoolExecutor

    from hami.certgen import ensure_allocation_key

    name = f"alloc-key-{uuid.uuid4().hex[:6]}"

    def data() -> dict[str, str]:
        return dict(prepared.get(Secret, name, namespace=NAMESPACE).data or {})

    try:
        with ThreadPoolExecutor(3) as pool:
            actions = list(pool.map(lambda _: ensure_allocation_key(prepared, NAMESPACE, name),
                                    range(3)))
        assert sorted(actions).count("created") == 1 and set(actions) <= {"created", "kept"}
        first = data()
        assert set(first) == {"current"} and len(base64.b64decode(first["current"])) == 64
        assert ensure_allocation_key(prepared, NAMESPACE, name) == "kept"
        assert ensure_allocation_key(prepared, NAMESPACE, name, rotate=True) == "next added"
        step1 = data()
        assert step1["current"] == first["current"] and step1["next"] != first["current"]
        assert ensure_allocation_key(prepared, NAMESPACE, name, rotate=True) == "rotated"
        step2 = data()
        assert step2 == {"current": step1["next"], "previous": first["current"]}
    finally:
        prepared.delete(Secret, name, namespace=NAMESPACE)


# -- webhook selection ---------------------------------------------------------------------


@pytest.fixture
def chart_webhook(prepared: Any, control_plane: ControlPlane,
                  tmp_path: Path) -> Iterator[Any]:
    """The chart's MutatingWebhookConfiguration as rendered for a release in ``default``
    (so ``default`` is selected and hami's own service accounts there are left out), with
    only its URL, CA bundle and failurePolicy (Fail, so nothing slips through unseen)
    swapped for a real ``hami scheduler`` process."""
    from tests.e2e.hami_harness import HamiProcess, Tls

    tls = Tls(tmp_path / "tls")
    hami = HamiProcess(control_plane, tls, tmp_path, name="chart-webhook").start()
    config = find(render(namespace="default"), "MutatingWebhookConfiguration")
    config["metadata"]["name"] = f"chart-webhook-{uuid.uuid4().hex[:6]}"
    (hook,) = config["webhooks"]
    hook["clientConfig"] = {"url": f"{hami.url}/webhook",
                            "caBundle": base64.b64encode(tls.ca_pem).decode()}
    hook["failurePolicy"] = "Fail"
    prepared.create(codecs.from_dict(config))
    wait_webhook_serving(prepared)
    try:
        yield prepared
    finally:
        prepared.delete(MutatingWebhookConfiguration, config["metadata"]["name"])
        hami.stop()


def test_chart_webhook_selects_by_namespace_so_a_pod_label_opts_nothing_out(
        chart_webhook: Any) -> None:
    """Issue 12 §3: with HAMi's objectSelector a pod labelled ``hami.io/webhook=ignore``
    skipped the webhook, and a hostPID GPU pod that turns its limits off was admitted.
    (This apiserver refuses privileged pods itself, so the attack uses the other rules.)"""
    from lightkube.resources.core_v1 import Namespace, ServiceAccount

    from tests.e2e.hami_harness import gpu_pod

    client = chart_webhook
    tenant, opted_out = (f"tenant-{uuid.uuid4().hex[:6]}", f"optout-{uuid.uuid4().hex[:6]}")
    ensure_namespace(client, tenant)
    client.create(Namespace(metadata=ObjectMeta(name=opted_out,
                                                labels={"hami.io/webhook": "ignore"})))
    ensure_namespace(client, opted_out)
    for ns in ("default", tenant):
        client.create(ServiceAccount(metadata=ObjectMeta(name="hami-device-plugin",
                                                         namespace=ns)))
    created: list[tuple[str, str]] = []

    def attack(namespace: str, account: str | None = None, **kw: Any) -> dict[str, Any]:
        pod = gpu_pod(f"evil-{uuid.uuid4().hex[:6]}", namespace=namespace,
                      node_selector={"e2e": "nowhere"}, **kw)
        pod["metadata"]["labels"] = {"hami.io/webhook": "ignore"}
        pod["spec"]["hostPID"] = True
        pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
        if account:
            pod["spec"]["serviceAccountName"] = account
        return pod

    def create_pod(pod: dict[str, Any]) -> Any:
        obj = client.create(codecs.from_dict(pod))
        created.append((pod["metadata"]["namespace"], pod["metadata"]["name"]))
        return obj

    try:
        for namespace, account in (("default", None), (tenant, None),
                                   (tenant, "hami-device-plugin")):
            with pytest.raises(ApiError) as err:
                create_pod(attack(namespace, account))
            message = err.value.status.message
            assert "spec.hostPID is true" in message, message
            assert "container main: env CUDA_DISABLE_CONTROL is reserved" in message
        labelled = attack("default")
        labelled["spec"]["hostPID"] = False
        del labelled["spec"]["containers"][0]["env"]
        mutated = create_pod(labelled)
        assert mutated.spec.schedulerName == "hami-scheduler"  # still mutated
        # what stays out: a namespace the admin excluded, and hami's own service account in
        # hami's own namespace (here "default")
        assert create_pod(attack(opted_out)).spec.schedulerName == "default-scheduler"
        own = create_pod(attack("default", "hami-device-plugin"))
        assert own.spec.schedulerName == "default-scheduler"
    finally:
        for namespace, name in created:
            client.delete(Pod, name, namespace=namespace, grace_period=0)
        client.delete(ServiceAccount, "hami-device-plugin", namespace="default")
        for ns in (tenant, opted_out):
            client.delete(Namespace, ns)


def test_kubectl_debug_container_is_hidden_from_the_nodes_gpus(
        prepared: Any, control_plane: ControlPlane, tmp_path: Path) -> None:
    """An ephemeral container (``kubectl debug``) cannot request a GPU, but where the
    NVIDIA runtime is the node's default one whose image sets NVIDIA_VISIBLE_DEVICES=all
    sees every GPU. The chart's webhook (its rules and device config, a real ``hami
    scheduler``) makes NVIDIA_VISIBLE_DEVICES=none the added container's last value."""
    from lightkube.resources.core_v1 import PodEphemeralcontainers

    from tests.e2e.hami_harness import HamiProcess, Tls

    objs = render(namespace="default")
    device_config = tmp_path / "device-config.yaml"
    device_config.write_text(find(objs, "ConfigMap", "hami-scheduler-device")["data"]
                             ["device-config.yaml"])
    tls = Tls(tmp_path / "tls")
    hami = HamiProcess(control_plane, tls, tmp_path, name="debug-webhook",
                       args=[f"--device-config-file={device_config}"]).start()
    config = find(objs, "MutatingWebhookConfiguration")
    config["metadata"]["name"] = f"debug-webhook-{uuid.uuid4().hex[:6]}"
    (hook,) = config["webhooks"]
    assert {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
            "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"} in hook["rules"]
    hook["clientConfig"] = {"url": f"{hami.url}/webhook",
                            "caBundle": base64.b64encode(tls.ca_pem).decode()}
    hook["failurePolicy"] = "Fail"
    prepared.create(codecs.from_dict(config))
    wait_webhook_serving(prepared)
    name = f"debug-me-{uuid.uuid4().hex[:6]}"
    try:
        prepared.create(codecs.from_dict({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeSelector": {"e2e": "nowhere"},
                     "containers": [{"name": "app", "image": "x"}]}}))
        debug = {"name": "debugger", "image": "nvidia/cuda",
                 "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
        for _ in range(10):  # kube-scheduler may update the pod's status in between
            body = prepared.get(Pod, name, namespace="default").to_dict()
            body["spec"]["ephemeralContainers"] = [debug]
            try:
                prepared.replace(PodEphemeralcontainers.from_dict(
                    {**body, "kind": "Pod", "apiVersion": "v1"}), name=name, namespace="default")
                break
            except ApiError as err:
                if err.status.code != 409:
                    raise
                time.sleep(0.2)
        after = prepared.get(Pod, name, namespace="default")
        (added,) = after.spec.ephemeralContainers
        assert [(e.name, e.value) for e in added.env] == [("NVIDIA_VISIBLE_DEVICES", "none")]
    finally:
        prepared.delete(Pod, name, namespace="default", grace_period=0)
        prepared.delete(MutatingWebhookConfiguration, config["metadata"]["name"])
        hami.stop()
