"""``metrics.secure.enabled`` (issue 25 §5): the chart turns on the secure metrics mode of
the scheduler and of both monitors, gives their accounts the two reviews, renders the
ClusterRole a Prometheus is bound to, and makes the ServiceMonitors present a token over
HTTPS. Off (the default) nothing of it is rendered. The RBAC rules are the ones the real
API server test (tests/e2e/test_metrics_secure_e2e.py) runs the components with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from tests.deploy.chart import NAMESPACE, container, find, render
from tests.deploy.test_hami_values import hami_containers, parse_with_hami
from tests.e2e.test_metrics_secure_e2e import READER_RULES, REVIEW_RULES

pytestmark = pytest.mark.usefixtures("require_helm")

SECURE = {"metrics": {"secure": {"enabled": True}}}
DRA = {"dra": {"enabled": True}}
REVIEW = [(r["apiGroups"][0], r["resources"][0]) for r in REVIEW_RULES]


def _pod(objs: Sequence[Mapping[str, Any]], kind: str, component: str) -> Mapping[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind
              and o["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    return obj["spec"]["template"]["spec"]


def _reviews(objs: Sequence[Mapping[str, Any]], role: str) -> list[tuple[str, str]]:
    rules = find(objs, "ClusterRole", role)["rules"]
    return [(g, res) for r in rules if r.get("verbs") == ["create"]
            for g in r.get("apiGroups", []) for res in r.get("resources", [])
            if g in ("authentication.k8s.io", "authorization.k8s.io")]


def test_off_by_default() -> None:
    objs = render(DRA)
    for kind, component, name in (("Deployment", "hami-scheduler", "vgpu-scheduler-extender"),
                                  ("DaemonSet", "hami-device-plugin", "vgpu-monitor"),
                                  ("DaemonSet", "hami-dra-plugin", "vgpu-monitor")):
        args = container(_pod(objs, kind, component), name)["args"]
        assert not [a for a in args if a.startswith("--metrics-secure")
                    or a.startswith("--metrics-cert")], (component, args)
    for role in ("hami-scheduler", "hami-device-plugin", "hami-dra-plugin"):
        assert _reviews(objs, role) == [], role
    assert not [o for o in objs if o["metadata"]["name"] == "hami-metrics-reader"]
    monitors = render({"prometheus": {"enabled": True}})
    for sm in (o for o in monitors if o["kind"] == "ServiceMonitor"):
        (endpoint,) = sm["spec"]["endpoints"]
        assert "scheme" not in endpoint and "bearerTokenFile" not in endpoint
        assert "authorization" not in endpoint
    assert not [o for o in monitors if "metrics-scraper" in o["metadata"]["name"]]


def test_enabled_turns_on_every_metrics_server_and_its_rbac() -> None:
    objs = render({**SECURE, **DRA})
    sched = _pod(objs, "Deployment", "hami-scheduler")
    ext = container(sched, "vgpu-scheduler-extender")
    assert {"--metrics-secure", "--metrics-cert-file=/tls/tls.crt",
            "--metrics-key-file=/tls/tls.key"} <= set(ext["args"])
    assert any(m["mountPath"] == "/tls" for m in ext["volumeMounts"])
    for component in ("hami-device-plugin", "hami-dra-plugin"):
        args = container(_pod(objs, "DaemonSet", component), "vgpu-monitor")["args"]
        assert "--metrics-secure" in args, component
        assert not [a for a in args if a.startswith("--metrics-cert")]  # self-signed
    for role in ("hami-scheduler", "hami-device-plugin", "hami-dra-plugin"):
        assert _reviews(objs, role) == REVIEW, role
    for c in hami_containers(objs):  # the real CLI accepts what the chart passes
        params = parse_with_hami(c["command"][1], list(c.get("args") or []))
        if c["name"] in ("vgpu-scheduler-extender", "vgpu-monitor"):
            assert params["metrics_secure"] is True, c["name"]
    reader = find(objs, "ClusterRole", "hami-metrics-reader")
    assert reader["rules"] == READER_RULES
    assert not [o for o in objs if o["kind"] == "ClusterRoleBinding"
                and o["roleRef"]["name"] == "hami-metrics-reader"]
    # no monitor, no review rights for the device plugin's account
    alone = render({**SECURE, "devicePlugin": {"monitor": {"enabled": False}}})
    assert _reviews(alone, "hami-device-plugin") == []
    assert _reviews(alone, "hami-scheduler") == REVIEW


SCRAPER, TOKEN_SECRET = "hami-metrics-scraper", "hami-metrics-scraper-token"


def _endpoints(objs: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (sched,) = find(objs, "ServiceMonitor", "hami-scheduler")["spec"]["endpoints"]
    (mon,) = find(objs, "ServiceMonitor", "hami-device-plugin-monitor")["spec"]["endpoints"]
    return sched, mon


def test_reader_binding_and_service_monitors() -> None:
    """The ServiceMonitors present a token over HTTPS with prometheus-operator's
    ``authorization`` (type Bearer, credentials from a Secret of their own namespace), not
    the deprecated ``bearerTokenFile`` (refused by operators that deny file access): the
    chart's own scraper account, bound to the metrics reader role and nothing else, and
    its ``kubernetes.io/service-account-token`` Secret."""
    objs = render({"metrics": {"secure": {"enabled": True, "readerServiceAccounts": [
        {"name": "prometheus-k8s", "namespace": "monitoring"}]}},
        "prometheus": {"enabled": True}})
    binding = find(objs, "ClusterRoleBinding", "hami-metrics-reader")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "hami-metrics-reader"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "prometheus-k8s",
                                    "namespace": "monitoring"}]
    auth = {"type": "Bearer", "credentials": {"name": TOKEN_SECRET, "key": "token"}}
    sched, mon = _endpoints(objs)
    for endpoint in (sched, mon):
        assert "bearerTokenFile" not in endpoint and "bearerTokenSecret" not in endpoint
        assert (endpoint["scheme"], endpoint["authorization"]) == ("https", auth)
    assert sched["tlsConfig"] == {"serverName": f"hami-scheduler.{NAMESPACE}.svc",
                                  "ca": {"secret": {"name": "hami-scheduler-tls",
                                                    "key": "ca.crt"}}}
    assert mon["tlsConfig"] == {"insecureSkipVerify": True}
    # the Secret the endpoints name is rendered, in the ServiceMonitors' namespace, as the
    # token of an account of that namespace that the chart binds to the reader role only
    secret = find(objs, "Secret", TOKEN_SECRET)
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["namespace"] == NAMESPACE == \
        find(objs, "ServiceMonitor", "hami-scheduler")["metadata"]["namespace"]
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": SCRAPER}
    account = find(objs, "ServiceAccount", SCRAPER)
    assert account["metadata"]["namespace"] == NAMESPACE
    assert account["automountServiceAccountToken"] is False
    bound = [b for b in objs if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s["name"] == SCRAPER for s in b["subjects"])]
    assert [(b["kind"], b["roleRef"]) for b in bound] == [
        ("ClusterRoleBinding", {"apiGroup": "rbac.authorization.k8s.io",
                                "kind": "ClusterRole", "name": "hami-metrics-reader"})]
    assert bound[0]["subjects"] == [{"kind": "ServiceAccount", "name": SCRAPER,
                                     "namespace": NAMESPACE}]


def test_service_monitors_can_name_your_own_token_secret() -> None:
    objs = render({"metrics": {"secure": {"enabled": True}},
                   "prometheus": {"enabled": True, "scrapeToken": {
                       "secretName": "prom-hami-token", "key": "bearer"}}})
    for endpoint in _endpoints(objs):
        assert endpoint["authorization"] == {
            "type": "Bearer", "credentials": {"name": "prom-hami-token", "key": "bearer"}}
        assert "bearerTokenFile" not in endpoint
    assert not [o for o in objs if SCRAPER in o["metadata"]["name"]]
    assert not [o for o in objs if o["kind"] == "Secret"
                and o["metadata"]["name"] == "prom-hami-token"]  # yours, not the chart's
    # without the ServiceMonitors the chart renders no scraper either
    alone = render({"metrics": {"secure": {"enabled": True}}})
    assert not [o for o in alone if SCRAPER in o["metadata"]["name"]]


def test_no_rendered_object_reads_a_token_file() -> None:
    """No ServiceMonitor endpoint of any combination reads a file of the Prometheus pod."""
    for values in ({"prometheus": {"enabled": True}},
                   {"prometheus": {"enabled": True}, **SECURE},
                   {"prometheus": {"enabled": True, "scrapeToken": {"secretName": "x"}},
                    **SECURE}):
        for sm in (o for o in render(values) if o["kind"] == "ServiceMonitor"):
            for endpoint in sm["spec"]["endpoints"]:
                assert not {"bearerTokenFile", "bearerTokenSecret"} & set(endpoint), values
                assert not {"caFile", "certFile", "keyFile"} & set(
                    endpoint.get("tlsConfig") or {}), values


@pytest.mark.parametrize("bad", [
    {"metrics": {"secure": {"enabled": "yes"}}},
    {"metrics": {"secure": {"readerServiceAccounts": [{"name": "p"}]}}},
    {"metrics": {"secure": {"enable": True}}},
    {"prometheus": {"scrapeToken": {"secretName": "Not_A_Name"}}},
    {"prometheus": {"scrapeToken": {"key": "a/b"}}},
    {"prometheus": {"scrapeToken": {"secret": "x"}}},
])
def test_schema_refuses_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(AssertionError, match="helm template failed"):
        render(bad)
