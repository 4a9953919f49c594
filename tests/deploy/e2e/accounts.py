"""The chart's accounts, RBAC and admission policies on the test apiserver: apply them for
real, act with real ServiceAccount tokens, remove them again (other tests of the session
write allocation annotations as cluster admin, which the policies refuse)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ServiceAccountToken

from hami.testing.controlplane import ControlPlane, ensure_namespace, wait_until
from tests.deploy.chart import NAMESPACE

#: What the tests apply of the chart.
APPLIED = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
           "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
_PROBE = {"apiVersion": "v1", "kind": "Pod",
          "metadata": {"name": "policy-probe", "namespace": "default",
                       "annotations": {"hami.io/bind-phase": "success"}},
          "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}}


def token(admin: Any, account: str, *, namespace: str = NAMESPACE,
          bound_pod: Any = None) -> str:
    """A fresh token of ``account`` (bound to ``bound_pod`` when given, as the kubelet's
    projected tokens are: the apiserver then adds the pod's node to the user's extra)."""
    spec = TokenRequestSpec(audiences=[], expirationSeconds=3600)
    if bound_pod is not None:
        spec.boundObjectRef = BoundObjectReference(
            kind="Pod", apiVersion="v1", name=bound_pod.metadata.name,
            uid=bound_pod.metadata.uid)
    reply = admin.create(ServiceAccountToken(metadata=ObjectMeta(name=account,
                                                                 namespace=namespace),
                                             spec=spec), account, namespace=namespace)
    return str(reply.status.token)


def kubeconfig(cp: ControlPlane, user: str, bearer: str, out: Path,
               namespace: str = NAMESPACE) -> Path:
    """The control plane's kubeconfig with ``bearer`` as the only credential."""
    cfg = yaml.safe_load(cp.kubeconfig.read_text())
    cfg["users"] = [{"name": user, "user": {"token": bearer}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = user
        ctx["context"]["namespace"] = namespace
    out.write_text(yaml.safe_dump(cfg))
    out.chmod(0o600)
    return out


def token_client(admin: Any, cp: ControlPlane, account: str, *, namespace: str = NAMESPACE,
                 bound_pod: Any = None) -> Any:
    """A lightkube Client authenticated as ``account`` (see :func:`token`)."""
    cfg = yaml.safe_load(cp.kubeconfig.read_text())
    cfg["users"] = [{"name": account,
                     "user": {"token": token(admin, account, namespace=namespace,
                                             bound_pod=bound_pod)}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = account
        ctx["context"]["namespace"] = namespace
    return Client(KubeConfig.from_dict(cfg), field_manager="hami-e2e", trust_env=False)


def policies_enforced(admin: Any) -> bool:
    """True while the chart's allocation policy refuses the admin a hand-written
    allocation (a dry run: nothing is created)."""
    try:
        admin.create(codecs.from_dict(_PROBE), dry_run=True)
        return False
    except ApiError as err:
        if err.status.code != 403:
            raise
        return True


def apply(admin: Any, objs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Server-side apply the chart's objects of the :data:`APPLIED` kinds; wait until the
    admission policies are in force when there are any. Returns what was applied."""
    ours = [o for o in objs if o["kind"] in APPLIED]
    ensure_namespace(admin, NAMESPACE)
    for doc in ours:
        admin.apply(codecs.from_dict(dict(doc)), field_manager="hami-e2e", force=True)
    if any(o["kind"] == "ValidatingAdmissionPolicyBinding" for o in ours):
        wait_until(lambda: policies_enforced(admin), timeout_s=30,
                   what="admission policies in force")
    return ours


def remove(admin: Any, applied: Sequence[Mapping[str, Any]]) -> None:
    """Delete what :func:`apply` applied; wait until the policies no longer hold."""
    for doc in reversed(applied):
        res = type(codecs.from_dict(dict(doc)))
        meta = doc["metadata"]
        kwargs = {"namespace": meta["namespace"]} if meta.get("namespace") else {}
        try:
            admin.delete(res, meta["name"], **kwargs)
        except ApiError as err:
            if err.status.code != 404:
                raise
    wait_until(lambda: not policies_enforced(admin), timeout_s=30,
               what="admission policies gone")
