"""hami.testing without binaries: the scheduler config renderer, the PKI, the version pin."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from cryptography import x509  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

from hami.testing.pki import CertificateAuthority  # noqa: E402
from hami.testing.processes import (  # noqa: E402
    FREE_PORT_RANGE,
    PINNED_KUBERNETES_VERSION,
    free_port,
    selected_kubernetes_version,
)
from hami.testing.scheduler_config import (  # noqa: E402
    HAMI_MANAGED_RESOURCES,
    VENDOR_MANAGED_RESOURCES,
    ExtenderConfig,
    render_scheduler_config,
)

REPO = Path(__file__).resolve().parents[2]


def _ephemeral_range() -> range:
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return range(low, high + 1)


@pytest.mark.skipif(not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux only")
def test_free_ports_are_outside_the_ephemeral_range_and_never_repeat():
    """A port outgoing connections can be given (the ephemeral range) is not handed to a
    process that binds it later; none twice in one test run."""
    ephemeral = _ephemeral_range()
    if ephemeral.start < FREE_PORT_RANGE.stop:
        pytest.skip(f"the ephemeral range {ephemeral} overlaps {FREE_PORT_RANGE}")
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(p in FREE_PORT_RANGE and p not in ephemeral for p in ports)


def test_version_matches_go_mod():
    go_mod = (REPO / "hack" / "k8s" / "go.mod").read_text()
    pinned = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes (v\S+)", go_mod, re.M)
    assert pinned is not None
    assert pinned.group(1) == PINNED_KUBERNETES_VERSION
    staging = re.findall(r"^\s*k8s\.io/\S+ => k8s\.io/\S+ (v\S+)", go_mod, re.M)
    assert staging and set(staging) == {"v0" + PINNED_KUBERNETES_VERSION[2:]}


@pytest.mark.parametrize("version", sorted(
    p.name for p in (REPO / "hack" / "k8s" / "versions").iterdir()))
def test_other_pins_are_one_release(version: str) -> None:
    """hack/k8s/pin.sh's modules: k8s.io/kubernetes at the release, every staging module
    at its v0 tag or (said in a comment) an earlier patch of the same minor."""
    go_mod = (REPO / "hack" / "k8s" / "versions" / version / "go.mod").read_text()
    assert re.search(rf"^\s*(?:require\s+)?k8s\.io/kubernetes {re.escape(version)}( |$)",
                     go_mod, re.M)
    minor = "v0." + version.split(".")[1] + "."
    for module, tag in re.findall(r"^\s*(k8s\.io/\S+) => k8s\.io/\S+ (v\S+)", go_mod, re.M):
        assert tag.startswith(minor), (module, tag)
        if tag != "v0" + version[2:]:
            assert f"// The Go module proxy has no {module} v0{version[2:]}: {tag}" in go_mod
    assert (REPO / "hack" / "k8s" / "versions" / version / "cmd" / "etcd" / "main.go").exists()


@pytest.mark.parametrize(("raw", "version"), [
    (None, PINNED_KUBERNETES_VERSION), ("  ", PINNED_KUBERNETES_VERSION),
    ("1.31.14", "v1.31.14"), ("v1.33.13", "v1.33.13"),
])
def test_selected_version(raw: str | None, version: str) -> None:
    env = {} if raw is None else {"HAMI_K8S_VERSION": raw}
    assert selected_kubernetes_version(env) == version


@pytest.mark.parametrize("raw", ["1.31", "v2.0.0", "latest", "1.31.14/../x"])
def test_selected_version_rejects_other_words(raw: str) -> None:
    with pytest.raises(ValueError, match="not a release"):
        selected_kubernetes_version({"HAMI_K8S_VERSION": raw})


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
            "preemptVerb": "preempt",
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
    registry = build_registry(sections)
    expected = registry.resource_names() - set(registry["NVIDIA"].resource_names().all())
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


def test_ca_and_leaf_profiles():
    """The CA signs certificates and CRLs; a leaf only signs, is no CA, names its issuer's
    key; both are valid from a little before now for VALIDITY."""
    import datetime as dt

    from hami.testing.pki import VALIDITY

    ca = CertificateAuthority.create("test-ca")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    leaf = x509.load_pem_x509_certificate(ca.issue("srv", server=True).cert_pem)
    assert leaf.issuer == ca_cert.subject
    for cert, is_ca in ((ca_cert, True), (leaf, False)):
        ext = cert.extensions
        basic = ext.get_extension_for_class(x509.BasicConstraints)
        assert basic.critical and basic.value.ca is is_ca
        usage = ext.get_extension_for_class(x509.KeyUsage)
        assert usage.critical and usage.value.digital_signature
        assert usage.value.key_cert_sign is is_ca and usage.value.crl_sign is is_ca
        assert not usage.value.key_encipherment
        now = dt.datetime.now(dt.UTC)
        assert cert.not_valid_before_utc < now < cert.not_valid_after_utc
        assert cert.not_valid_after_utc - cert.not_valid_before_utc > VALIDITY
    ca_key_id = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    leaf_auth = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert leaf_auth.key_identifier == ca_key_id.digest


def test_issue_needs_a_usage():
    with pytest.raises(ValueError):
        CertificateAuthority.create("ca").issue("nobody")


def test_controlplane_module_still_runs_the_up_command():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "hami.testing.controlplane", "up", "--help"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "--gpu-node" in out.stdout and "--extender-url" in out.stdout


def test_pki_and_kubeconfig_files(tmp_path: Path):
    import yaml

    from hami.testing.clusterconfig import KUBERNETES_SERVICE_IP, write_kubeconfig, write_pki

    pki = write_pki(tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    for stem in ("serving", "admin", "sa", "front-proxy-client"):
        assert {f"{stem}.crt", f"{stem}.key"} <= names
    assert {"ca.crt", "front-proxy-ca.crt"} <= names
    serving = x509.load_pem_x509_certificate((tmp_path / "serving.crt").read_bytes())
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert KUBERNETES_SERVICE_IP in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    path = tmp_path / "kubeconfig"
    write_kubeconfig(path, "https://127.0.0.1:1", pki.ca.cert_pem, "u", pki.admin)
    assert path.stat().st_mode & 0o777 == 0o600
    doc = yaml.safe_load(path.read_text())
    assert doc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:1"
    assert doc["users"][0]["name"] == "u"


def test_audit_events_filter_by_user_and_time(tmp_path: Path):
    import datetime as dt
    import json

    from hami.testing.clusterconfig import read_audit_events

    log = tmp_path / "audit.log"
    assert read_audit_events(log) == []
    rows = [{"user": {"username": "a"}, "requestReceivedTimestamp": "2025-01-01T00:00:00Z"},
            {"user": {"username": "b"}, "requestReceivedTimestamp": "2025-01-02T00:00:00Z"},
            {"user": {"username": "a"}, "requestReceivedTimestamp": "2025-01-03T00:00:00Z"}]
    log.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"partial')
    assert len(read_audit_events(log)) == 3
    assert [e["requestReceivedTimestamp"][:10] for e in read_audit_events(log, "a")] == [
        "2025-01-01", "2025-01-03"]
    since = dt.datetime(2025, 1, 2, tzinfo=dt.UTC)
    assert [e["user"]["username"] for e in read_audit_events(log, since=since)] == ["b", "a"]
