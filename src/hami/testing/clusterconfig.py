"""The configuration of the test control plane (:mod:`hami.testing.controlplane`): its
certificates, kubeconfigs, the flags of etcd, kube-apiserver and kube-scheduler, and the
apiserver's audit policy and log.

Nothing here starts a process; the functions write files into the control plane's
working directory or return argument lists and documents.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hami.testing.pki import CertificateAuthority, KeyPair, service_account_keys
from hami.testing.processes import HOST

#: ClusterIP of the ``kubernetes`` Service (first address of the service range); the
#: apiserver's serving certificate names it, so in-cluster clients can verify it.
KUBERNETES_SERVICE_IP = "10.96.0.1"

#: Audit policy of the test apiserver: the requests of service accounts (the identities
#: hami's components run as in the chart's RBAC tests), metadata only; nothing else.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


@dataclass(frozen=True, slots=True)
class ClusterPki:
    """The cluster CA and the admin client pair that :func:`write_pki` made."""

    ca: CertificateAuthority
    admin: KeyPair


def write_pki(pki_dir: Path) -> ClusterPki:
    """Make a fresh cluster CA and write, as PEM files in ``pki_dir``: ``ca.crt``; the
    apiserver's serving pair ``serving.crt``/``.key`` (127.0.0.1, the ``kubernetes``
    Service IP and names); the admin client ``admin.*`` (group ``system:masters``); the
    service-account signing pair ``sa.*`` (``sa.crt`` holds the public key); the
    aggregation layer's ``front-proxy-ca.crt`` and ``front-proxy-client.*``.
    """
    pki_dir.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority.create("hami-e2e-ca")
    (pki_dir / "ca.crt").write_bytes(ca.cert_pem)
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
           "kubernetes.default.svc.cluster.local"]
    ca.issue("hami-e2e-serving", ip_sans=[HOST, KUBERNETES_SERVICE_IP], dns_sans=dns,
             server=True).write(pki_dir, "serving")
    admin = ca.issue("hami-e2e-admin", groups=["system:masters"], client=True)
    admin.write(pki_dir, "admin")
    service_account_keys().write(pki_dir, "sa")  # sa.crt holds the public key
    # The aggregation layer's front proxy, as in kubeadm clusters; kube-scheduler's
    # delegated authentication reads this CA from the apiserver and logs errors
    # without it.
    front_proxy_ca = CertificateAuthority.create("hami-e2e-front-proxy-ca")
    (pki_dir / "front-proxy-ca.crt").write_bytes(front_proxy_ca.cert_pem)
    front_proxy_ca.issue("front-proxy-client", client=True).write(
        pki_dir, "front-proxy-client"
    )
    return ClusterPki(ca, admin)


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, user: str,
                     pair: KeyPair) -> None:
    """Write a kubeconfig (mode 0600) for ``server`` (an https URL) trusting ``ca_pem``,
    authenticating as ``user`` with the client certificate ``pair``; namespace default."""
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "hami-e2e", "cluster": {
            "server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(pair.cert_pem),
            "client-key-data": b64(pair.key_pem)}}],
        "contexts": [{"name": "hami-e2e", "context": {
            "cluster": "hami-e2e", "user": user, "namespace": "default"}}],
        "current-context": "hami-e2e",
    }
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def etcd_argv(binary: Path, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    """etcd's command line: one member on 127.0.0.1, plain HTTP, no fsync (test data)."""
    client_url = f"http://{HOST}:{client_port}"
    peer_url = f"http://{HOST}:{peer_port}"
    return [
        str(binary),
        "--name=hami-e2e",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=hami-e2e={peer_url}",
        "--unsafe-no-fsync=true",  # test data: durability does not matter
        "--log-level=warn",
    ]


def write_audit_policy(path: Path) -> Path:
    """Write :data:`AUDIT_POLICY` as YAML at ``path``; returns ``path``."""
    path.write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
    return path


def apiserver_argv(binary: Path, *, etcd_port: int, port: int, pki: Path,
                   audit_policy: Path, audit_log: Path, verbosity: int,
                   extra: Sequence[str] = ()) -> list[str]:
    """kube-apiserver's command line: serving on 127.0.0.1:``port`` with the
    certificates of :func:`write_pki` in ``pki``, Node+RBAC authorization, the audit
    policy and log given, then ``extra`` flags."""
    return [
        str(binary),
        f"--etcd-servers=http://{HOST}:{etcd_port}",
        f"--bind-address={HOST}",
        f"--advertise-address={HOST}",
        f"--secure-port={port}",
        f"--tls-cert-file={pki / 'serving.crt'}",
        f"--tls-private-key-file={pki / 'serving.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--service-account-key-file={pki / 'sa.crt'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--service-cluster-ip-range=10.96.0.0/16",
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        "--authorization-mode=Node,RBAC",
        f"--audit-policy-file={audit_policy}",
        f"--audit-log-path={audit_log}",
        # The "kubernetes" Service endpoints would be 127.0.0.1, which Endpoints
        # validation rejects; nothing in the tests needs them.
        "--endpoint-reconciler-type=none",
        "--enable-priority-and-fairness=false",
        "--profiling=false",
        f"--v={verbosity}",
        *extra,
    ]


#: Seconds an unschedulable pod waits in kube-scheduler's unschedulable pool before its
#: queue retries it without an event (kube-scheduler's default: 300). The queue looks
#: every 30 s (a constant), so a pod is retried within about 35 s at most.
UNSCHEDULABLE_RETRY_S = 5


def scheduler_argv(binary: Path, *, config: Path, port: int, pki: Path, kubeconfig: Path,
                   verbosity: int, unschedulable_retry: str | None = f"{UNSCHEDULABLE_RETRY_S}s",
                   extra: Sequence[str] = ()) -> list[str]:
    """kube-scheduler's command line: ``config`` (a KubeSchedulerConfiguration file),
    serving ``/readyz`` on 127.0.0.1:``port`` with the apiserver's serving pair, then
    ``extra`` (later flags win). ``unschedulable_retry`` None leaves
    ``--pod-max-in-unschedulable-pods-duration`` out (a test that passes the chart's own
    arguments in ``extra``).

    ``--pod-max-in-unschedulable-pods-duration`` (deprecated but served from v1.29 to
    v1.37; no KubeSchedulerConfiguration field sets it) is :data:`UNSCHEDULABLE_RETRY_S`:
    a pod left unschedulable is retried only on a cluster event that a queueing hint of
    a plugin that rejected it maps to it, and some changes bring none. v1.37's
    DynamicResources counts a claim's consumed capacity twice while the claim is both in
    its assume cache and still in flight (between the end of one pod's claim write and
    its PreBind's clean-up): a pod filtered in that moment fails with "cannot allocate all
    claims", and the clean-up sends no event, so that pod would wait 5 minutes; CI's
    waits are shorter."""
    retry = ([] if unschedulable_retry is None
             else [f"--pod-max-in-unschedulable-pods-duration={unschedulable_retry}"])
    return [
        str(binary),
        f"--config={config}",
        *retry,
        f"--bind-address={HOST}",
        f"--secure-port={port}",
        f"--tls-cert-file={pki / 'serving.crt'}",
        f"--tls-private-key-file={pki / 'serving.key'}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--v={verbosity}",
        *extra,
    ]


def read_audit_events(audit_log: Path, username: str | None = None, *,
                      since: _dt.datetime | None = None) -> list[dict[str, Any]]:
    """The audit events in ``audit_log`` (JSON lines), oldest first, optionally only
    those of ``username`` and those received at or after ``since`` (an aware datetime).
    A missing file gives ``[]``; a line still being written is skipped."""
    try:
        lines = audit_log.read_text().splitlines()
    except FileNotFoundError:
        return []
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line still being written
        if username is not None and event.get("user", {}).get("username") != username:
            continue
        if since is not None:
            stamp = str(event.get("requestReceivedTimestamp") or "")
            try:
                received = _dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            except ValueError:
                continue
            if received < since:
                continue
        events.append(event)
    return events


__all__ = ["AUDIT_POLICY", "KUBERNETES_SERVICE_IP", "UNSCHEDULABLE_RETRY_S", "ClusterPki",
           "apiserver_argv", "etcd_argv", "read_audit_events", "scheduler_argv",
           "write_audit_policy", "write_kubeconfig", "write_pki"]
