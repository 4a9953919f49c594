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
