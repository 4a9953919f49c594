"""Secure metrics against the real API server (issue 25 §5).

``hami scheduler`` (a child process) and the monitor's loop and listener (in this
process) run as ServiceAccounts of their own, with the RBAC the chart gives them in
secure mode (create TokenReviews and SubjectAccessReviews, besides their reads); the
scrapers are ServiceAccounts with real tokens from the TokenRequest API. Without
``--metrics-secure`` every scrape gets the series (the state before); with it an
unauthenticated scrape and a forged token get 401, a valid token without the metrics
reader role 403, and a token bound to that ClusterRole the series, over TLS.
"""

from __future__ import annotations

import base64
import contextlib
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami.testing.controlplane import HOST, ControlPlane, ensure_namespace, free_port, wait_until
from tests.e2e.hami_harness import HamiProcess, Tls, make_gpu_node, unique

pytestmark = pytest.mark.e2e

NS = "hami-metrics-e2e"
#: The chart's <release>-metrics-reader rule (tests/deploy/test_chart_metrics_secure.py
#: checks the chart renders exactly this).
READER_RULES = [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
#: What the chart adds to the scheduler's and the device plugin's ClusterRoles.
REVIEW_RULES = [
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
     "verbs": ["create"]},
]
#: The component reads (a subset of the chart's roles: enough to start and to serve).
READ_RULES = [{"apiGroups": [""], "resources": ["nodes", "pods", "resourcequotas"],
               "verbs": ["get", "list", "watch"]},
              {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]


def _apply_rbac(client: Any, name: str, rules: list[dict[str, Any]], accounts: list[str]) -> None:
    from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding

    client.apply(ClusterRole.from_dict({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name}, "rules": rules}), field_manager="e2e", force=True)
    client.apply(ClusterRoleBinding.from_dict({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": a, "namespace": NS}
                     for a in accounts]}), field_manager="e2e", force=True)


def _token(client: Any, account: str) -> str:
    """A real ServiceAccount token (TokenRequest API, one hour)."""
    from lightkube import ApiError
    from lightkube.models.authentication_v1 import TokenRequestSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import ServiceAccount, ServiceAccountToken

    with contextlib.suppress(ApiError):
        client.create(ServiceAccount(metadata=ObjectMeta(name=account, namespace=NS)))
    req = ServiceAccountToken(metadata=ObjectMeta(),
                              spec=TokenRequestSpec(audiences=[], expirationSeconds=3600))
    out = client.create(req, name=account, namespace=NS)
    return str(out.status.token)


def _kubeconfig(cp: ControlPlane, path: Path, token: str) -> Path:
    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "e2e", "cluster": {
               "server": cp.server,
               "certificate-authority-data": base64.b64encode(cp.ca_file.read_bytes()).decode()}}],
           "users": [{"name": "sa", "user": {"token": token}}],
           "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "sa"}}],
           "current-context": "e2e"}
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def accounts(control_plane: ControlPlane, kube_client: Any,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Tokens of the scrapers and kubeconfigs of the components."""
    ensure_namespace(kube_client, NS)
    tokens = {a: _token(kube_client, a) for a in
              ("hami-scheduler", "hami-device-plugin", "prometheus", "intruder")}
    _apply_rbac(kube_client, "e2e-hami-metrics-reader", READER_RULES, ["prometheus"])
    _apply_rbac(kube_client, "e2e-hami-components", REVIEW_RULES + READ_RULES,
                ["hami-scheduler", "hami-device-plugin"])
    work = tmp_path_factory.mktemp("metrics-secure")
    return {"tokens": tokens, "work": work,
            "scheduler": _kubeconfig(control_plane, work / "scheduler.kubeconfig",
                                     tokens["hami-scheduler"]),
            "monitor": _kubeconfig(control_plane, work / "monitor.kubeconfig",
                                   tokens["hami-device-plugin"])}


def scrape(url: str, token: str | None, context: ssl.SSLContext | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=15, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def answers(url: str, tokens: Mapping[str, str], context: ssl.SSLContext | None,
            series: str) -> dict[str, int]:
    """The status of each kind of scrape; a 200 must carry ``series``."""
    cases = {"no token": None, "forged token": "eyJhbGciOiJSUzI1NiJ9.e30.forged",
             "token without the role": tokens["intruder"],
             "component's own token (no role)": tokens["hami-scheduler"],
             "token bound to metrics-reader": tokens["prometheus"]}
    out = {}
    for label, token in cases.items():
        status, body = scrape(url, token, context)
        if status == 200:
            assert series in body, (label, body[:500])
        else:
            assert series not in body, (label, body[:500])
        out[label] = status
    return out


AFTER = {"no token": 401, "forged token": 401, "token without the role": 403,
         "component's own token (no role)": 403, "token bound to metrics-reader": 200}
BEFORE = dict.fromkeys(AFTER, 200)


def test_scheduler_metrics(control_plane: ControlPlane, kube_client: Any,
                           accounts: dict[str, Any]) -> None:
    node = unique("metrics-node")
    make_gpu_node(kube_client, node)
    series = f'device_uuid="GPU-{node}-0"'  # the node's GPU series (hami_gpu_*)
    work: Path = accounts["work"]
    tls = Tls(work / "tls")
    kubeconfig = f"--kubeconfig={accounts['scheduler']}"
    plain = HamiProcess(control_plane, tls, work, args=[kubeconfig], name="plain").start()
    try:
        url = f"http://{HOST}:{plain.metrics_port}/metrics"
        wait_until(lambda: series in scrape(url, None, None)[1], timeout_s=30,
                   what="the node's series")
        assert answers(url, accounts["tokens"], None, series) == BEFORE
    finally:
        plain.stop()
    secure = HamiProcess(control_plane, tls, work, name="secure", args=[
        kubeconfig, "--metrics-secure", f"--metrics-cert-file={tls.cert_file}",
        f"--metrics-key-file={tls.key_file}"]).start()
    try:
        url = f"https://{HOST}:{secure.metrics_port}/metrics"
        verify = ssl.create_default_context(cadata=tls.ca_pem.decode())
        assert scrape(url, accounts["tokens"]["prometheus"], verify)[0] == 200
        wait_until(lambda: series in scrape(url, accounts["tokens"]["prometheus"], verify)[1],
                   timeout_s=30, what="the node's series")
        assert answers(url, accounts["tokens"], verify, series) == AFTER
        # plain HTTP on the secure port gets nothing; the server carries on
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(url.replace("https:", "http:"), timeout=5).read()
        assert answers(url, accounts["tokens"], verify, series) == AFTER
        secure.alive()
    finally:
        secure.stop()


@contextlib.contextmanager
def monitor(kubeconfig: Path, hook: Path, secure: bool) -> Iterator[int]:
    from hami.deviceplugin.kube import KubeApi, make_client
    from hami.monitor.command import run_monitor

    (hook / "containers").mkdir(parents=True, exist_ok=True)
    port = free_port()
    stop = threading.Event()
    thread = threading.Thread(target=run_monitor, kwargs={
        "node": "metrics-monitor-node", "hook_path": hook,
        "kube": KubeApi(make_client(kubeconfig)), "stop": stop, "bind": f"{HOST}:{port}",
        "interval_s": 0.5, "mig_lock": hook / "mig.lock",
        "secure": ("", "") if secure else None}, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join(15)
        assert not thread.is_alive()


def status(url: str, context: ssl.SSLContext | None) -> int:
    """The status of a scrape without a token; 0 while nothing listens."""
    try:
        return scrape(url, None, context)[0]
    except OSError:
        return 0


def _insecure() -> ssl.SSLContext:
    """Prometheus' ``insecureSkipVerify`` against the monitor's self-signed certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def test_monitor_metrics(accounts: dict[str, Any]) -> None:
    series = 'hami_build_info{'
    hook = accounts["work"] / "hook"
    with monitor(accounts["monitor"], hook, secure=False) as port:
        url = f"http://{HOST}:{port}/metrics"
        wait_until(lambda: status(url, None) == 200, timeout_s=20, what="monitor")
        assert answers(url, accounts["tokens"], None, series) == BEFORE
    with monitor(accounts["monitor"], hook, secure=True) as port:
        url = f"https://{HOST}:{port}/metrics"
        wait_until(lambda: status(url, _insecure()) == 401, timeout_s=20,
                   what="secure monitor")
        assert answers(url, accounts["tokens"], _insecure(), series) == AFTER
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(url.replace("https:", "http:"), timeout=5).read()
        assert answers(url, accounts["tokens"], _insecure(), series) == AFTER
