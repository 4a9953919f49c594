"""``hami certgen``'s certificates (pure part; the apiserver part is in e2e)."""

from __future__ import annotations

import datetime as dt

import pytest

pytest.importorskip("cryptography")

from hami.certgen import TlsBundle, generate, service_hosts, still_good  # noqa: E402

HOSTS = service_hosts("hami-scheduler", "hami-system")


def test_hosts_cover_service_names_and_loopback() -> None:
    assert HOSTS == ["hami-scheduler", "hami-scheduler.hami-system",
                     "hami-scheduler.hami-system.svc",
                     "hami-scheduler.hami-system.svc.cluster.local", "127.0.0.1"]


def test_generated_bundle_is_good_and_round_trips() -> None:
    bundle = generate(HOSTS, validity_days=365)
    assert still_good(bundle, HOSTS)
    assert TlsBundle.from_secret_data(bundle.to_secret_data()) == bundle
    assert b"PRIVATE KEY" in bundle.tls_key


def test_renewal_rules() -> None:
    now = dt.datetime.now(dt.UTC)
    bundle = generate(HOSTS, validity_days=40, now=now)
    assert still_good(bundle, HOSTS, now=now)
    assert not still_good(bundle, HOSTS, now=now + dt.timedelta(days=11))  # < 30 days left
    assert not still_good(bundle, [*HOSTS, "other.svc"], now=now)  # name not covered
    other = generate(HOSTS)
    mixed = TlsBundle(other.ca_crt, bundle.tls_crt, bundle.tls_key)
    assert not still_good(mixed, HOSTS)  # not signed by the stored CA
    assert not still_good(TlsBundle(b"junk", b"junk", b"junk"), HOSTS)


def test_bad_secret_data() -> None:
    assert TlsBundle.from_secret_data(None) is None
    assert TlsBundle.from_secret_data({"ca.crt": "!!", "tls.crt": "", "tls.key": ""}) is None
    assert TlsBundle.from_secret_data({"tls.crt": "", "tls.key": ""}) is None


def test_allocation_key_rotation_never_refuses_a_valid_signature(tmp_path) -> None:
    """Two steps: 'next' is accepted everywhere before anyone signs with it; then it
    becomes 'current' and the old key stays accepted as 'previous'."""
    import base64

    from hami.certgen import allocation_key_step
    from hami.core.provenance import sign, verify
    from hami.keyring import KeyRing

    ann = {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,1000,0:;"}

    def mount(data):  # what kubelet writes into the Secret volume
        for name in ("current", "next", "previous"):
            path = tmp_path / name
            if name in data:
                path.write_bytes(base64.b64decode(data[name]))
            elif path.exists():
                path.unlink()
        return KeyRing(tmp_path)

    first = allocation_key_step(None, rotate=False)
    assert allocation_key_step(first, rotate=False) is None  # kept
    ring = mount(first)
    old_signature = sign(ring.signing_key(), "u", "n", ann)
    step1 = allocation_key_step(first, rotate=True)
    assert step1["current"] == first["current"] and step1["next"]
    ring = mount(step1)
    assert ring.signing_key() == base64.b64decode(first["current"])  # still signs with old
    step2 = allocation_key_step(step1, rotate=True)
    assert step2["current"] == step1["next"] and step2["previous"] == first["current"]
    assert "next" not in step2
    new_signature = sign(base64.b64decode(step2["current"]), "u", "n", ann)
    # a device plugin that has step 1 accepts the new signature, one with step 2 the old
    verify(mount(step1).verifying_keys(), "u", "n", {**ann, "hami.io/vgpu-allocation-signature": new_signature})
    verify(mount(step2).verifying_keys(), "u", "n", {**ann, "hami.io/vgpu-allocation-signature": old_signature})


def test_without_kubeconfig_certgen_uses_the_pods_service_account(monkeypatch, tmp_path) -> None:
    """In the chart's pod there is no kubeconfig: the ServiceAccount's in-cluster config
    must be used (lightkube's Client(None, trust_env=False) reads only ~/.kube/config)."""
    from lightkube import KubeConfig
    from typer.testing import CliRunner

    from hami.cli import app

    used: list[str] = []

    def in_cluster(*args: object, **kwargs: object) -> KubeConfig:
        used.append("service account")
        return KubeConfig.from_server("https://127.0.0.1:1")  # nothing listens there

    monkeypatch.setattr(KubeConfig, "from_service_account", classmethod(
        lambda cls, *a, **k: in_cluster()))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    result = CliRunner().invoke(app, ["certgen", "--namespace", "ns",
                                      "--allocation-key-secret", "key"])
    assert used == ["service account"], result.output
    assert "no Kubernetes configuration" not in result.output
