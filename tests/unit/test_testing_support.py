"""hami.testing without binaries: the scheduler config renderer, the PKI, the version pin."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from cryptography import x509  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

from hami.testing.controlplane import KUBERNETES_VERSION  # noqa: E402
from hami.testing.pki import CertificateAuthority  # noqa: E402
from hami.testing.scheduler_config import (  # noqa: E402
    HAMI_MANAGED_RESOURCES,
    VENDOR_MANAGED_RESOURCES,
    ExtenderConfig,
    render_scheduler_config,
)

REPO = Path(__file__).resolve().parents[2]


def test_version_matches_go_mod():
    go_mod = (REPO / "hack" / "k8s" / "go.mod").read_text()
    pinned = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes (v\S+)", go_mod, re.M)
    assert pinned is not None
    assert pinned.group(1) == KUBERNETES_VERSION
    staging = re.findall(r"^\s*k8s\.io/\S+ => k8s\.io/\S+ (v\S+)", go_mod, re.M)
    assert staging and set(staging) == {"v0" + KUBERNETES_VERSION[2:]}


def test_hami_extender_config_matches_the_chart():
    doc = render_scheduler_config(kubeconfig="/k", extender=ExtenderConfig("https://127.0.0.1:443"))
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert doc["kind"] == "KubeSchedulerConfiguration"
    assert doc["profiles"] == [{"schedulerName": "hami-scheduler"}]
    assert doc["clientConnection"] == {"kubeconfig": "/k", "qps": 100.0, "burst": 200}
    assert doc["leaderElection"] == {"leaderElect": False}
    assert doc["extenders"] == [
        {
            "urlPrefix": "https://127.0.0.1:443",
            "filterVerb": "filter",
            "bindVerb": "bind",
            "nodeCacheCapable": True,
            "weight": 1,
            "httpTimeout": "30s",
            "enableHTTPS": True,
            "tlsConfig": {"insecure": True},
            "managedResources": [
                {"name": r, "ignoredByScheduler": True}
                for r in (*HAMI_MANAGED_RESOURCES, *VENDOR_MANAGED_RESOURCES)
            ],
        }
    ]
    assert "nvidia.com/gpumem-percentage" in HAMI_MANAGED_RESOURCES


def test_vendor_managed_resources_are_the_registry_defaults():
    """kube-scheduler sends a pod to hami only for these names: every default resource of
    every vendor the chart enables must be listed, once."""
    from hami.devices.registry import SECTIONS, build_registry

    sections = {s: {} for s in SECTIONS if s not in ("nvidia", "iluvatars", "vnpus")}
    expected = build_registry(sections).resource_names()
    assert len(VENDOR_MANAGED_RESOURCES) == len(set(VENDOR_MANAGED_RESOURCES))
    assert set(VENDOR_MANAGED_RESOURCES) == expected


def test_plain_scheduler_config_has_no_extender():
    doc = render_scheduler_config(
        kubeconfig=None, scheduler_name="default-scheduler", leader_elect=True
    )
    assert "extenders" not in doc
    assert doc["clientConnection"] == {"qps": 100.0, "burst": 200}
    assert "clientConnection" not in render_scheduler_config(
        kubeconfig=None, client_qps=None, client_burst=None)
    assert doc["leaderElection"]["resourceName"] == "default-scheduler"


def test_ca_issues_certificates_python_ssl_accepts(tmp_path: Path):
    ca = CertificateAuthority.create("test-ca")
    server = ca.issue("srv", ip_sans=["127.0.0.1"], dns_sans=["localhost"], server=True)
    client = ca.issue("admin", groups=["system:masters"], client=True)
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    crt, key = server.write(tmp_path, "srv")
    assert key.stat().st_mode & 0o077 == 0
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    ctx.load_verify_locations(tmp_path / "ca.crt")

    cert = x509.load_pem_x509_certificate(client.cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == (
        "system:masters"
    )
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_issue_needs_a_usage():
    with pytest.raises(ValueError):
        CertificateAuthority.create("ca").issue("nobody")
