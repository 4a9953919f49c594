"""The chart's ValidatingAdmissionPolicies as rendered (issue 12 §2, §6): the allocation
keys they guard are the ones the hami scheduler reads with the chart's device config, and
they name exactly hami's accounts. Their behaviour on the real apiserver is in
tests/deploy/e2e/test_rbac_on_apiserver.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.chart import NAMESPACE, find, render

ALLOCATIONS, ACCOUNTS = "hami-allocations", "hami-service-accounts"

pytestmark = pytest.mark.usefixtures("require_helm")




def variable(policy: dict[str, Any], name: str) -> str:
    (expr,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return str(expr)


def guarded_keys(objs: list[dict[str, Any]]) -> set[str]:
    return set(json.loads(variable(find(objs, "ValidatingAdmissionPolicy", ALLOCATIONS),
                                   "keys")))


def scheduler_keys(objs: list[dict[str, Any]], tmp_path: Path) -> frozenset[str]:
    """allocation_keys() of the config the hami scheduler builds from the chart's files."""
    from hami.core.provenance import allocation_keys
    from hami.settings import scheduler_config

    path = tmp_path / "device-config.yaml"
    path.write_text(find(objs, "ConfigMap", "hami-scheduler-device")["data"]
                    ["device-config.yaml"])
    return allocation_keys(scheduler_config(path))


@pytest.mark.parametrize("values", [
    None,
    {"devices": {"vendors": {"hygon": {"enabled": False}, "metax": {"enabled": False}}}},
    {"device-config": {"content": "nvidia:\n  resourceCountName: nvidia.com/gpu\n"
                                  "amd: {}\nkunlun:\n  resourceCountName: kunlunxin.com/xpu\n"}},
])
def test_guarded_keys_are_the_allocation_keys_the_scheduler_reads(
        values: dict[str, Any] | None, tmp_path: Path) -> None:
    objs = render(values)
    keys = scheduler_keys(objs, tmp_path)
    assert guarded_keys(objs) == keys
    assert {"hami.io/vgpu-devices-to-allocate", "hami.io/bind-phase", "hami.io/vgpu-node"} <= keys


def test_vendor_switches_reach_the_policy(tmp_path: Path) -> None:
    default = guarded_keys(render())
    assert "hami.io/dcu-devices-allocated" in default
    assert "hami.io/Biren-devices-to-allocate" in default
    without = guarded_keys(render({"devices": {"vendors": {"hygon": {"enabled": False}}}}))
    assert default - without == {"hami.io/dcu-devices-allocated", "hami.io/dcu-devices-to-allocate"}
    extra = guarded_keys(render({"admissionPolicy": {
        "extraAllocationKeys": ["hami.io/Ascend910B-devices-allocated"]}}))
    assert extra - default == {"hami.io/Ascend910B-devices-allocated"}


def test_policies_name_exactly_hamis_accounts() -> None:
    def users(values: dict[str, Any] | None) -> tuple[str, str]:
        objs = render(values)
        alloc = find(objs, "ValidatingAdmissionPolicy", ALLOCATIONS)["spec"]
        own = find(objs, "ValidatingAdmissionPolicy", ACCOUNTS)["spec"]
        return alloc["matchConditions"][0]["expression"], own["matchConditions"][0]["expression"]

    sched = f"system:serviceaccount:{NAMESPACE}:hami-scheduler"
    plugin = f"system:serviceaccount:{NAMESPACE}:hami-device-plugin"
    alloc, own = users(None)
    assert alloc == f'!(request.userInfo.username in ["{sched}","{plugin}"])'
    assert own == f'request.userInfo.username in ["{sched}","{plugin}"]'
    alloc, own = users({"scheduler": {"serviceAccountName": "s"},
                        "devicePlugin": {"serviceAccountName": "d"}})
    assert alloc == (f'!(request.userInfo.username in ["system:serviceaccount:{NAMESPACE}:s",'
                     f'"system:serviceaccount:{NAMESPACE}:d"])')
    alloc, own = users({"devicePlugin": {"enabled": False}})
    assert alloc == f'!(request.userInfo.username in ["{sched}"])'
    # other vendors' device plugins may be allowed to write allocations, no more
    vendor = "system:serviceaccount:kube-system:cambricon-device-plugin"
    alloc_x, own_x = users({"admissionPolicy": {"extraWriters": [vendor]}})
    assert alloc_x == f'!(request.userInfo.username in ["{sched}","{plugin}","{vendor}"])'
    assert own_x == f'request.userInfo.username in ["{sched}","{plugin}"]'
    # kube-scheduler's own account is no exception: it never writes allocations
    assert "kube-scheduler" not in alloc + own


def test_policies_cover_every_way_onto_a_pod() -> None:
    objs = render()
    for name in (ALLOCATIONS, ACCOUNTS):
        policy = find(objs, "ValidatingAdmissionPolicy", name)["spec"]
        assert policy["failurePolicy"] == "Fail"
        binding = find(objs, "ValidatingAdmissionPolicyBinding", name)["spec"]
        assert binding == {"policyName": name, "validationActions": ["Deny"]}
    rules = find(objs, "ValidatingAdmissionPolicy", ALLOCATIONS)["spec"]["matchConstraints"]
    assert [(r["operations"], r["resources"]) for r in rules["resourceRules"]] == [
        (["CREATE", "UPDATE"], ["pods", "pods/status"]), (["CREATE"], ["pods/binding"])]
    rules = find(objs, "ValidatingAdmissionPolicy", ACCOUNTS)["spec"]["matchConstraints"]
    assert [(r["operations"], r["resources"]) for r in rules["resourceRules"]] == [
        (["UPDATE"], ["pods", "nodes"]), (["CREATE"], ["pods/binding"])]


def test_no_policy_where_the_api_is_missing_or_when_disabled() -> None:
    kinds = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    assert not [o for o in render({"admissionPolicy": {"enabled": False}}) if o["kind"] in kinds]
    assert len([o for o in render(kube_version="v1.31.0") if o["kind"] in kinds]) == 6


def test_certgen_writes_only_tls_secrets() -> None:
    """certgen may create any Secret in the release namespace (RBAC cannot limit a create
    by name); a service-account-token Secret would get a token of another account there
    (kube-scheduler's, which deletes pods)."""
    objs = render()
    spec = find(objs, "ValidatingAdmissionPolicy", "hami-scheduler-secrets")["spec"]
    assert spec["matchConditions"][0]["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:hami-scheduler"')
    assert spec["matchConstraints"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    assert [v["expression"] for v in spec["validations"]] == ['object.type == "kubernetes.io/tls"']
    # no certgen, no Secret rights, no policy
    for values in ({"scheduler": {"certManager": {"enabled": True}}},
                   {"scheduler": {"patch": {"enabled": False}}}):
        assert not [o for o in render(values) if o["metadata"]["name"] == "hami-scheduler-secrets"]
