"""The chart's RBAC against the API calls the code makes (tests/deploy/api_calls.py), in
both directions, for every values file; kube-scheduler's own ServiceAccount; the table
against the code (issue 12 §6)."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import api_calls
from tests.deploy.api_calls import DEVICE_PLUGIN, DRA_PLUGIN, KUBE_SCHEDULER, SCHEDULER, Call
from tests.deploy.chart import (
    CI_VALUES,
    NAMESPACE,
    container,
    find,
    render,
)

SRC = Path(__file__).resolve().parents[2] / "src"
CASES: dict[str, tuple[dict[str, Any] | None, list[Path]]] = {
    "default": (None, []),
    "ha-certmanager": (None, [CI_VALUES / "ha-certmanager-values.yaml"]),
    "minimal": (None, [CI_VALUES / "minimal-values.yaml"]),
    "own-kube-scheduler": ({"scheduler": {"kubeScheduler": {"enabled": False}}}, []),
    "no-preemption": ({"scheduler": {"preemption": {"enabled": False}}}, []),
    "no-webhook": ({"scheduler": {"admissionWebhook": {"enabled": False}}}, []),
    "dra": ({"dra": {"enabled": True}}, []),
    "metrics-secure": ({"metrics": {"secure": {"enabled": True}}}, []),
    "metrics-secure-servicemonitors": ({"metrics": {"secure": {"enabled": True}},
                                        "prometheus": {"enabled": True}}, []),
    "dra-metrics-secure": ({"dra": {"enabled": True}, "metrics": {"secure": {"enabled": True}}},
                           []),
    "dra-only-no-monitor": ({"dra": {"enabled": True, "monitor": {"enabled": False}},
                             "devicePlugin": {"enabled": False}}, []),
}
ACCOUNTS = {SCHEDULER: "hami-scheduler", DEVICE_PLUGIN: "hami-device-plugin",
            KUBE_SCHEDULER: "hami-kube-scheduler", DRA_PLUGIN: "hami-dra-plugin"}

pytestmark = pytest.mark.usefixtures("require_helm")




@pytest.fixture(scope="module", params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    values, files = CASES[request.param]
    return request.param, render(values, files=files)


@dataclass(frozen=True)
class Grant:
    """One rule of a rendered role as bound to an account: ``namespace`` None when a
    ClusterRoleBinding binds it (cluster-wide)."""

    role: str
    rule: Mapping[str, Any]
    namespace: str | None


def bound_roles(objs: Sequence[Mapping[str, Any]], account: str) -> list[tuple[str, str, str | None]]:
    """(role kind, role name, namespace or None) of every binding naming the account."""
    out = []
    for b in objs:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if any(s["kind"] == "ServiceAccount" and s["name"] == account
               and s.get("namespace") == NAMESPACE for s in b["subjects"]):
            ns = b["metadata"]["namespace"] if b["kind"] == "RoleBinding" else None
            out.append((b["roleRef"]["kind"], b["roleRef"]["name"], ns))
    return out


def grants(objs: Sequence[Mapping[str, Any]], account: str) -> tuple[list[Grant], list[str]]:
    """The rendered rules bound to ``account``, and the names of roles it is bound to that
    the chart does not render (Kubernetes' built-in roles)."""
    out, builtin = [], []
    for kind, name, ns in bound_roles(objs, account):
        roles = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name
                 and (kind == "ClusterRole" or o["metadata"]["namespace"] == ns)]
        if not roles:
            builtin.append(name)
            continue
        (role,) = roles
        out += [Grant(name, rule, ns) for rule in role["rules"]]
    return out, builtin


def allows(grant: Grant, call: Call, names: Mapping[str, str], verb: str | None = None) -> bool:
    rule = grant.rule
    if call.group not in rule["apiGroups"] or call.resource not in rule["resources"]:
        return False
    if (verb or call.verb) not in rule["verbs"]:
        return False
    if rule.get("resourceNames") and (call.name is None
                                      or names[call.name] not in rule["resourceNames"]):
        return False
    return grant.namespace is None or (call.scope == "release" and grant.namespace == NAMESPACE)


def test_every_call_is_allowed_and_every_rule_is_a_call(
        case: tuple[str, list[dict[str, Any]]]) -> None:
    """Issue 12 §6: 'several granted verbs are unused'; the device plugin's node watch was
    not granted at all."""
    label, objs = case
    names = api_calls.chart_names(objs)
    for component, account in ACCOUNTS.items():
        if not any(o["kind"] == "ServiceAccount" and o["metadata"]["name"] == account
                   for o in objs):
            continue
        calls = api_calls.active(component, objs)
        rules, _ = grants(objs, account)
        for call in calls:
            assert any(allows(g, call, names) for g in rules), (label, account, call)
        for g in rules:
            for verb in g.rule["verbs"]:
                for res in g.rule["resources"]:
                    for group in g.rule["apiGroups"]:
                        served = [c for c in calls if (c.verb, c.resource, c.group) ==
                                  (verb, res, group) and allows(g, c, names)]
                        where = (label, account, g.role, group, res, verb)
                        assert served, f"granted, never called: {where}"
                        if g.namespace is None:
                            assert any(c.scope == "cluster" for c in served), \
                                f"cluster-wide grant for release-namespace calls: {where}"
                        if not g.rule.get("resourceNames") and verb != "create":
                            assert any(c.name is None for c in served), \
                                f"could be limited to resourceNames: {where}"


def test_accounts_and_their_built_in_roles(case: tuple[str, list[dict[str, Any]]]) -> None:
    """Issue 12 §6: the extender's account was bound to system:kube-scheduler, which
    deletes pods; kube-scheduler now runs under its own account."""
    label, objs = case
    for account in (ACCOUNTS[SCHEDULER], ACCOUNTS[DEVICE_PLUGIN], ACCOUNTS[DRA_PLUGIN]):
        _, builtin = grants(objs, account)
        assert builtin == [], (label, account, builtin)
    for obj in objs:
        for rule in obj.get("rules") or []:
            assert "*" not in rule["verbs"], rule
            assert "*" not in rule.get("resources", rule.get("nonResourceURLs")), rule
            verbs = set(rule["verbs"])
            if rule.get("resources") == ["resourceclaimtemplates"]:
                # DRA mode collects the templates hami made (hami.dra.templategc); the
                # chart's admission policy <release>-dra-templates lets the scheduler
                # delete only those (label hami.io/dra-template=true)
                assert label.startswith("dra") and find(
                    objs, "ValidatingAdmissionPolicy", "hami-dra-templates"), (label, rule)
                verbs -= {"delete"}
            assert not {"delete", "deletecollection", "escalate", "bind",
                        "impersonate"} & verbs, rule
    kube_scheduler = any(c["name"] == "kube-scheduler" for o in objs if o["kind"] == "Deployment"
                         for c in o["spec"]["template"]["spec"]["containers"])
    if kube_scheduler:
        _, builtin = grants(objs, ACCOUNTS[KUBE_SCHEDULER])
        assert sorted(builtin) == ["extension-apiserver-authentication-reader",
                                   "system:kube-scheduler", "system:volume-scheduler"]
    else:
        assert not bound_roles(objs, ACCOUNTS[KUBE_SCHEDULER])


def test_kube_scheduler_container_gets_only_its_own_token() -> None:
    """One pod keeps /filter and /bind on loopback; each container mounts one token."""
    sa_path = "/var/run/secrets/kubernetes.io/serviceaccount"
    objs = render()
    pod = find(objs, "Deployment", "hami-scheduler")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == ACCOUNTS[SCHEDULER]
    assert pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}

    def token_volume(c: Mapping[str, Any]) -> Mapping[str, Any]:
        (mount,) = [m for m in c.get("volumeMounts") or [] if m["mountPath"] == sa_path]
        assert mount.get("readOnly") is True
        return volumes[mount["name"]]

    secret = find(objs, "Secret", "hami-kube-scheduler-token")
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": ACCOUNTS[KUBE_SCHEDULER]}
    ks = token_volume(container(pod, "kube-scheduler"))
    assert ks["secret"]["secretName"] == "hami-kube-scheduler-token"
    assert {i["key"] for i in ks["secret"]["items"]} == {"token", "ca.crt", "namespace"}
    for c in (container(pod, "vgpu-scheduler-extender"), container(pod, "certgen", init=True)):
        own = token_volume(c)["projected"]["sources"]
        assert own[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}
    # without kube-scheduler in the pod there is no second account, no token Secret
    alone = render({"scheduler": {"kubeScheduler": {"enabled": False}}})
    assert not [o for o in alone if o["kind"] == "Secret"
                and o["type"] == "kubernetes.io/service-account-token"]
    assert not [o for o in alone if o["kind"] == "ServiceAccount"
                and o["metadata"]["name"] == ACCOUNTS[KUBE_SCHEDULER]]


def _functions(module: str) -> set[str]:
    mod = importlib.import_module(module)
    out = set()
    for cls_name in api_calls.API_MODULES[module]:
        cls = getattr(mod, cls_name)
        out |= {f"{module}:{cls_name}.{n}" for n, f in vars(cls).items()
                if callable(f) or isinstance(f, classmethod) if not n.startswith("_")}
    return out


def test_the_table_covers_the_api_layer() -> None:
    """Every public method of the API layer is in the table (or said to be outside the
    chart), and every code site the table names exists: a new API call cannot slip past
    the RBAC check."""
    named = {w for calls in api_calls.CALLS.values() for c in calls for w in c.where}
    for where in named | set(api_calls.NOT_IN_CHART):
        module, _, qual = where.partition(":")
        obj: Any = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
        assert callable(obj), where
    methods = set().union(*(_functions(m) for m in api_calls.API_MODULES))
    missing = methods - named - set(api_calls.NOT_IN_CHART)
    assert not missing, f"API methods the table does not list: {sorted(missing)}"
    certgen = importlib.import_module("hami.certgen")
    talks = {f"hami.certgen:{n}" for n, f in vars(certgen).items() if inspect.isfunction(f)
             and "client." in inspect.getsource(f) and n != "certgen"}
    assert talks <= named | set(api_calls.NOT_IN_CHART), talks - named


def test_only_the_api_layer_talks_to_the_apiserver() -> None:
    allowed = set(api_calls.API_MODULES) | set(api_calls.OUTSIDE_CHART)
    offenders = []
    for path in sorted((SRC / "hami").rglob("*.py")):
        module = ".".join(path.relative_to(SRC).with_suffix("").parts)
        if module.startswith("hami.testing"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] in ("lightkube", "kubernetes") for n in names) \
                    and module not in allowed:
                offenders.append(module)
    assert not offenders, sorted(set(offenders))
