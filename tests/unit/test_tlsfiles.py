"""Certificate rotation without a restart (:class:`hami.tlsfiles.TlsReloader`).

The kubelet updates a mounted Secret by writing the new files into a fresh directory and
swapping the volume's ``..data`` link (the files themselves are links through it), which
is how cert-manager and ``hami certgen`` renewals reach the scheduler and the monitor.
New connections must get the new pair, and a rotation written half-way must never take
the certificate away. Handshakes go through the real HTTPS listener of ``/metrics``."""

from __future__ import annotations

import os
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami.monitor.command import run_monitor, serve_metrics
from hami.testing.pki import CertificateAuthority, KeyPair
from hami.testing.processes import free_port
from hami.tlsfiles import TlsReloader
from tests.node.fakes import FakeKube


class _Collector:
    def render(self) -> bytes:
        return b"hami_build_info 1\n"


def _pair(ca: CertificateAuthority) -> KeyPair:
    return ca.issue("hami", ip_sans=["127.0.0.1"], server=True)


def mount_secret(volume: Path, pair: KeyPair) -> tuple[Path, Path]:
    """Write ``pair`` into ``volume`` as the kubelet updates a Secret volume: the files in
    a new timestamped directory, ``..data`` swapped to it by one rename, ``tls.crt`` and
    ``tls.key`` links through ``..data``. Returns the two paths a server is given."""
    volume.mkdir(exist_ok=True)
    stamp = volume / f"..{time.time_ns()}"
    stamp.mkdir()
    pair.write(stamp, "tls")
    tmp = volume / "..data_tmp"
    tmp.symlink_to(stamp.name)
    os.replace(tmp, volume / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (volume / name).is_symlink():
            (volume / name).symlink_to(f"..data/{name}")
    return volume / "tls.crt", volume / "tls.key"


def verifies(port: int, ca: CertificateAuthority) -> bool:
    """Whether a TLS handshake with 127.0.0.1:``port`` verifies against ``ca`` (False on
    a certificate from another CA)."""
    ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
            return True
    except ssl.SSLCertVerificationError:
        return False


def wait_until_verifies(port: int, ca: CertificateAuthority, timeout_s: float = 20.0) -> None:
    """Wait until handshakes with ``port`` verify against ``ca``.

    Raises:
        AssertionError: not within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while not verifies(port, ca):
        assert time.monotonic() < deadline, f"port {port} still serves another certificate"
        time.sleep(0.05)


@pytest.fixture
def cas() -> tuple[CertificateAuthority, CertificateAuthority]:
    return CertificateAuthority.create("old-ca"), CertificateAuthority.create("new-ca")


@pytest.fixture
def served(tmp_path: Path, cas: tuple[CertificateAuthority, CertificateAuthority]
           ) -> Iterator[tuple[TlsReloader, int]]:
    crt, key = mount_secret(tmp_path / "tls", _pair(cas[0]))
    reloader = TlsReloader(str(crt), str(key))
    server = serve_metrics(_Collector(), "127.0.0.1", 0, ssl_context=reloader.context)
    try:
        yield reloader, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_rotated_secret_is_served_to_new_connections(
        tmp_path: Path, cas: tuple[CertificateAuthority, CertificateAuthority],
        served: tuple[TlsReloader, int]) -> None:
    reloader, port = served
    old, new = cas
    assert verifies(port, old) and not verifies(port, new)
    assert not reloader.maybe_reload() and reloader.reloads == 1  # nothing changed
    mount_secret(tmp_path / "tls", _pair(new))
    assert reloader.maybe_reload() and reloader.reloads == 2
    assert verifies(port, new) and not verifies(port, old)
    assert not reloader.maybe_reload()


def test_a_half_written_pair_keeps_the_old_certificate(
        tmp_path: Path, cas: tuple[CertificateAuthority, CertificateAuthority],
        served: tuple[TlsReloader, int]) -> None:
    """A renewal written in place, certificate first: until the key matches, the old pair
    stays; a removed file changes nothing either; the finished pair is then served."""
    reloader, port = served
    old, new = cas
    crt, key = Path(reloader.cert_file), Path(reloader.key_file)
    pair = _pair(new)
    for target in (crt, key):  # in-place writes, not the kubelet's swap
        data = target.read_bytes()
        target.unlink()
        target.write_bytes(data)
    crt.write_bytes(pair.cert_pem)  # the key is still the old one: not a pair
    assert not reloader.maybe_reload()
    key.unlink()
    assert not reloader.maybe_reload()
    assert verifies(port, old)
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\ntruncated")
    assert not reloader.maybe_reload()
    assert verifies(port, old)
    key.write_bytes(pair.key_pem)
    assert reloader.maybe_reload()
    assert verifies(port, new) and not verifies(port, old)


def test_a_pair_loads_and_reloads_without_a_writable_temporary_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        cas: tuple[CertificateAuthority, CertificateAuthority]) -> None:
    """The chart runs the scheduler and the monitor with a read-only root file system and
    no /tmp: loading a pair must not need a temporary directory (it did, and the chart's
    scheduler crashed at start with "No usable temporary directory found")."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
    with pytest.raises(FileNotFoundError):
        tempfile.mkdtemp()  # what a read-only root gives
    old, new = cas
    crt, key = mount_secret(tmp_path / "tls", _pair(old))
    reloader = TlsReloader(str(crt), str(key))
    server = serve_metrics(_Collector(), "127.0.0.1", 0, ssl_context=reloader.context)
    try:
        port = server.server_address[1]
        assert verifies(port, old)
        mount_secret(tmp_path / "tls", _pair(new))
        assert reloader.maybe_reload()
        assert verifies(port, new)
    finally:
        server.shutdown()
        server.server_close()


def test_a_self_signed_certificate_needs_no_temporary_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--metrics-secure`` without a pair makes a self-signed certificate at start; on a
    read-only root file system with no /tmp that must work too."""
    from hami.metricsauth import self_signed_context

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
    context, ca_pem = self_signed_context(["127.0.0.1"])
    server = serve_metrics(_Collector(), "127.0.0.1", 0, ssl_context=context)
    try:
        verify = ssl.create_default_context(cadata=ca_pem.decode())
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as raw, \
                verify.wrap_socket(raw, server_hostname="127.0.0.1"):
            pass
    finally:
        server.shutdown()
        server.server_close()


def test_a_missing_pair_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        TlsReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))


def test_the_monitor_serves_a_rotated_metrics_certificate_without_a_restart(
        tmp_path: Path, cas: tuple[CertificateAuthority, CertificateAuthority]) -> None:
    """``hami monitor --metrics-secure --metrics-cert-file ...``: its loop picks up the
    kubelet's update of the Secret; before, the pair was read once at start."""
    old, new = cas
    crt, key = mount_secret(tmp_path / "tls", _pair(old))
    hook = tmp_path / "vgpu"
    (hook / "containers").mkdir(parents=True)
    port, stop = free_port(), threading.Event()
    loop = threading.Thread(target=run_monitor, kwargs=dict(
        node="node-a", hook_path=hook, kube=FakeKube(), stop=stop, bind=f"127.0.0.1:{port}",
        interval_s=0.05, mig_lock=hook / "no-mig.lock", secure=(str(crt), str(key))),
        daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + 20
        while True:  # the listener comes up with the old pair
            try:
                assert verifies(port, old)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline and loop.is_alive()
                time.sleep(0.05)
        mount_secret(tmp_path / "tls", _pair(new))
        wait_until_verifies(port, new)
        assert not verifies(port, old)
    finally:
        stop.set()
        loop.join(10)
    assert not loop.is_alive()
