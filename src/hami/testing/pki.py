"""Certificates and keys for a throw-away local cluster, made with ``cryptography``.

Everything here is for loopback test clusters: one self-signed CA, leaf certificates it
signs for servers (``127.0.0.1``/``localhost``) and clients (CN = user, O = groups), and a
service-account signing key pair. Keys are ECDSA P-256 (fast to generate, accepted by
kube-apiserver, etcd, kube-scheduler and Python's ``ssl``).
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Validity of every certificate made here.
VALIDITY = _dt.timedelta(days=365)
#: Backdating of ``not_valid_before``, so clocks a little apart still accept them.
_BACKDATE = _dt.timedelta(minutes=5)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _base_builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
                  *, ca: bool) -> x509.CertificateBuilder:
    """What every certificate here has: subject, issuer, key, a random serial, validity
    from :data:`_BACKDATE` before now to :data:`VALIDITY` after it, and critical basic
    constraints and key usage (digital signature; a CA also signs certificates and CRLs)."""
    now = _dt.datetime.now(_dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """PKCS#8 PEM of a private key, unencrypted."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """SubjectPublicKeyInfo PEM of the public half of ``key``."""
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key (both ``bytes``)."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        """Write ``<stem>.crt`` and ``<stem>.key`` (mode 0600) into ``directory``.

        Returns the two paths (certificate, key).
        """
        crt = directory / f"{stem}.crt"
        key = directory / f"{stem}.key"
        crt.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return crt, key


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates.

    Example::

        ca = CertificateAuthority.create("hami-test-ca")
        server = ca.issue("kube-apiserver", ip_sans=["127.0.0.1"], dns_sans=["localhost"],
                          server=True)
        admin = ca.issue("admin", groups=["system:masters"], client=True)
    """

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self._cert = cert
        self._key = key

    @classmethod
    def create(cls, common_name: str) -> CertificateAuthority:
        """Make a new CA with a fresh key; its certificate is valid for :data:`VALIDITY`."""
        key = _new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        cert = (
            _base_builder(name, name, key.public_key(), ca=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate as PEM."""
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        *,
        groups: Sequence[str] = (),
        ip_sans: Sequence[str] = (),
        dns_sans: Sequence[str] = (),
        server: bool = False,
        client: bool = False,
    ) -> KeyPair:
        """Issue a leaf certificate signed by this CA, with a fresh key.

        Args:
            common_name: subject CN; Kubernetes reads it as the user name of a client.
            groups: subject O entries; Kubernetes reads them as the user's groups.
            ip_sans, dns_sans: subject alternative names (IP literals, DNS names).
            server, client: extended key usages to include; at least one must be true.

        Raises:
            ValueError: neither ``server`` nor ``client`` was asked for, or an IP SAN is
                not an IP address.
        """
        if not (server or client):
            raise ValueError("a certificate needs server=True, client=True or both")
        key = _new_key()
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            _base_builder(x509.Name(subject), self._cert.subject, key.public_key(), ca=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_sans]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_sans]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem(key))


def service_account_keys() -> KeyPair:
    """A key pair for kube-apiserver's service-account tokens.

    ``cert_pem`` holds the *public key* PEM (for ``--service-account-key-file``) and
    ``key_pem`` the private key (for ``--service-account-signing-key-file``).
    """
    key = _new_key()
    return KeyPair(public_key_pem(key), key_pem(key))
