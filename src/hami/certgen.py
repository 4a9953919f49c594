"""``hami certgen``: the webhook's TLS without manual steps (the chart's init container).

Run by an init container of every scheduler pod. It makes sure one Secret holds a
self-signed CA and a serving certificate for the scheduler Service, writes the pair to a
directory shared with the ``hami scheduler`` container, and puts the CA into the
``caBundle`` of the chart's MutatingWebhookConfiguration.

Replicas starting together are safe: the Secret is created with ``create`` (one wins, the
others get 409 and read the winner's), and a certificate is replaced only when it is
missing, malformed, does not cover the Service names, or expires within 30 days.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

#: Renew a certificate that expires within this many days.
RENEW_BEFORE_DAYS = 30


@dataclass(frozen=True)
class TlsBundle:
    """PEM-encoded CA certificate, serving certificate and its private key."""

    ca_crt: bytes
    tls_crt: bytes
    tls_key: bytes

    def to_secret_data(self) -> dict[str, str]:
        """The ``data`` of a ``kubernetes.io/tls`` Secret (base64 values)."""
        return {
            "ca.crt": base64.b64encode(self.ca_crt).decode(),
            "tls.crt": base64.b64encode(self.tls_crt).decode(),
            "tls.key": base64.b64encode(self.tls_key).decode(),
        }

    @classmethod
    def from_secret_data(cls, data: dict[str, str] | None) -> TlsBundle | None:
        """Read a Secret's ``data``; None when a key is missing or not base64."""
        data = data or {}
        try:
            return cls(*(base64.b64decode(data[k], validate=True)
                         for k in ("ca.crt", "tls.crt", "tls.key")))
        except (KeyError, ValueError):
            return None


def service_hosts(service: str, namespace: str) -> list[str]:
    """DNS names the apiserver may use for the Service, plus 127.0.0.1 (kube-scheduler
    calls the extender in the same pod)."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local", "127.0.0.1"]


def generate(hosts: Sequence[str], *, validity_days: int = 3650,
             now: dt.datetime | None = None) -> TlsBundle:
    """A new self-signed CA (ECDSA P-256) and a serving certificate for ``hosts`` (DNS
    names or IP addresses; the first is the subject CN)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = now or dt.datetime.now(dt.UTC)
    start = now - dt.timedelta(minutes=5)
    end = now + dt.timedelta(days=validity_days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hami-webhook-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return TlsBundle(
        ca.public_bytes(pem), cert.public_bytes(pem),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()))


def still_good(bundle: TlsBundle, hosts: Sequence[str], *,
               now: dt.datetime | None = None) -> bool:
    """Whether ``bundle`` can be kept: parseable, signed by its CA, covering ``hosts``, and
    valid for more than :data:`RENEW_BEFORE_DAYS` days."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import ec

    now = now or dt.datetime.now(dt.UTC)
    try:
        ca = x509.load_pem_x509_certificate(bundle.ca_crt)
        cert = x509.load_pem_x509_certificate(bundle.tls_crt)
        ca_key = ca.public_key()
        if not isinstance(ca_key, ec.EllipticCurvePublicKey):
            return False
        cert.verify_directly_issued_by(ca)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
        return False
    names = {str(n) for n in san.get_values_for_type(x509.DNSName)}
    names |= {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    if not set(hosts) <= names:
        return False
    remaining = min(cert.not_valid_after_utc, ca.not_valid_after_utc) - now
    return remaining > dt.timedelta(days=RENEW_BEFORE_DAYS)


def _get_secret(client: Any, namespace: str, name: str) -> Any:
    """The Secret, or None when it does not exist (other API errors raise)."""
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Secret

    try:
        return client.get(Secret, name, namespace=namespace)
    except ApiError as err:
        if err.status.code != 404:
            raise
        return None


def ensure_secret(client: Any, namespace: str, secret: str, hosts: Sequence[str], *,
                  validity_days: int = 3650) -> tuple[TlsBundle, str]:
    """Return the bundle stored in Secret ``namespace/secret``, creating or renewing it.

    Returns ``(bundle, action)`` with action ``created``, ``renewed`` or ``kept`` (also
    when another replica created or renewed it first: its bundle is used).
    """
    from lightkube import ApiError
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Secret

    for _attempt in range(5):
        live = _get_secret(client, namespace, secret)
        if live is not None:
            bundle = TlsBundle.from_secret_data(live.data)
            if bundle is not None and still_good(bundle, hosts):
                return bundle, "kept"
            fresh = generate(hosts, validity_days=validity_days)
            live.data = fresh.to_secret_data()
            try:
                client.replace(live)  # carries resourceVersion: a compare-and-swap
            except ApiError as err:
                if err.status.code == 409:
                    continue  # another replica renewed it: read theirs
                raise
            return fresh, "renewed"
        fresh = generate(hosts, validity_days=validity_days)
        obj = Secret(metadata=ObjectMeta(name=secret, namespace=namespace,
                                         labels={"app.kubernetes.io/component": "hami-scheduler"}),
                     type="kubernetes.io/tls", data=fresh.to_secret_data())
        try:
            client.create(obj)
        except ApiError as err:
            if err.status.code == 409:
                continue
            raise
        return fresh, "created"
    raise RuntimeError(f"secret {namespace}/{secret}: gave up after repeated conflicts")


def patch_ca_bundle(client: Any, webhook: str, ca_pem: bytes) -> int:
    """Set ``clientConfig.caBundle`` of every webhook in the MutatingWebhookConfiguration
    ``webhook`` and, when there is one (the chart's DRA mode), the
    ValidatingWebhookConfiguration of the same name; returns how many entries changed.

    Raises:
        lightkube ``ApiError``: the mutating configuration is missing or unreadable, or
            a patch fails (a missing validating one is skipped).
    """
    from lightkube import ApiError
    from lightkube.resources.admissionregistration_v1 import (
        MutatingWebhookConfiguration,
        ValidatingWebhookConfiguration,
    )
    from lightkube.types import PatchType

    value = base64.b64encode(ca_pem).decode()
    changed = 0
    for kind in (MutatingWebhookConfiguration, ValidatingWebhookConfiguration):
        try:
            live = client.get(kind, webhook)
        except ApiError as err:
            if kind is ValidatingWebhookConfiguration and err.status.code == 404:
                continue
            raise
        ops = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": value}
               for i, wh in enumerate(live.webhooks or [])
               if (wh.clientConfig.caBundle or "") != value]
        if ops:
            client.patch(kind, webhook, ops, patch_type=PatchType.JSON)
        changed += len(ops)
    return changed


def new_allocation_key() -> str:
    """64 hex digits (256 bits) from the OS's CSPRNG."""
    import secrets

    return secrets.token_hex(32)


def allocation_key_step(data: dict[str, str] | None, rotate: bool) -> dict[str, str] | None:
    """The allocation-key Secret's next ``data`` (base64 values), or None to keep it.

    No ``current``: a new one. ``rotate`` without ``next``: add a new ``next`` (every
    verifier learns it before anyone signs with it). ``rotate`` with ``next``: promote it
    to ``current`` and keep the old ``current`` as ``previous`` (see :mod:`hami.keyring`).
    """
    data = dict(data or {})
    if not data.get("current"):
        data["current"] = base64.b64encode(new_allocation_key().encode()).decode()
        data.pop("next", None)
        return data
    if not rotate:
        return None
    if data.get("next"):
        data["previous"], data["current"] = data["current"], data.pop("next")
    else:
        data["next"] = base64.b64encode(new_allocation_key().encode()).decode()
    return data


def ensure_allocation_key(client: Any, namespace: str, secret: str, *,
                          rotate: bool = False) -> str:
    """Create the allocation-key Secret when it is missing or has no ``current`` key, and
    with ``rotate`` take one rotation step (:func:`allocation_key_step`); a
    compare-and-swap on the Secret's resourceVersion, retried on conflicts. Returns
    ``created``, ``kept``, ``next added`` or ``rotated``.
    """
    from lightkube import ApiError
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Secret

    for _attempt in range(5):
        live = _get_secret(client, namespace, secret)
        data = allocation_key_step(live.data if live is not None else None, rotate)
        if data is None:
            return "kept"
        action = ("created" if live is None or not (live.data or {}).get("current")
                  else "rotated" if "previous" in data and not data.get("next")
                  else "next added")
        try:
            if live is None:
                client.create(Secret(metadata=ObjectMeta(
                    name=secret, namespace=namespace,
                    labels={"app.kubernetes.io/component": "hami-scheduler"}),
                    type="Opaque", data=data))
            else:
                live.data = data
                client.replace(live)
        except ApiError as err:
            if err.status.code == 409:
                continue
            raise
        return action
    raise RuntimeError(f"secret {namespace}/{secret}: gave up after repeated conflicts")


def write_files(bundle: TlsBundle, out_dir: Path) -> None:
    """Write ``tls.crt``, ``tls.key`` (mode 0600) and ``ca.crt`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data, mode in (("ca.crt", bundle.ca_crt, 0o644), ("tls.crt", bundle.tls_crt, 0o644),
                             ("tls.key", bundle.tls_key, 0o600)):
        tmp = out_dir / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, out_dir / name)


def certgen(
    namespace: Annotated[str, typer.Option(envvar="POD_NAMESPACE",
                                           help="namespace of the Secret and Service")],
    secret: Annotated[str, typer.Option(help="Secret holding ca.crt, tls.crt, tls.key")] = "",
    service: Annotated[str, typer.Option(help="Service the webhook is called through")] = "",
    webhook: Annotated[str, typer.Option(help="Mutating (and Validating, when there is "
                                         "one) WebhookConfiguration to patch "
                                         "('' = none)")] = "",
    out_dir: Annotated[Path | None, typer.Option(help="also write the files here")] = None,
    validity_days: Annotated[int, typer.Option(
        min=31, help="lifetime of a new certificate, days; renewed within 30 days of "
                     "expiry")] = 3650,
    kubeconfig: Annotated[Path | None, typer.Option(
        envvar="KUBECONFIG",
        help="kubeconfig file (default: the pod's service account, else ~/.kube/config)")
    ] = None,
    allocation_key_secret: Annotated[str, typer.Option(
        help="Secret of the allocation-signing key: created when missing")] = "",
    rotate_allocation_key: Annotated[bool, typer.Option(
        help="one rotation step of the allocation key: the first run adds 'next', a run "
             "after kubelet synced it (a few minutes) makes it 'current'")] = False,
) -> None:
    """Create or reuse the webhook's self-signed TLS and patch the webhook's caBundle;
    create (and rotate) the allocation-signing key."""
    from lightkube import ApiError, Client

    from hami.kubehint import load_kubeconfig

    try:
        # in the chart's pod: the ServiceAccount (lightkube's Client(None) with
        # trust_env=False would read ~/.kube/config only)
        config = load_kubeconfig(kubeconfig)
        client = Client(config, field_manager="hami-certgen", trust_env=False)
        if secret and not service:
            raise RuntimeError("--secret needs --service (the names the certificate covers)")
        if rotate_allocation_key and not allocation_key_secret:
            raise RuntimeError("--rotate-allocation-key needs --allocation-key-secret")
        if allocation_key_secret:
            action = ensure_allocation_key(client, namespace, allocation_key_secret,
                                           rotate=rotate_allocation_key)
            typer.echo(f"secret {namespace}/{allocation_key_secret}: {action}")
        if secret:
            hosts = service_hosts(service, namespace)
            bundle, action = ensure_secret(client, namespace, secret, hosts,
                                           validity_days=validity_days)
            typer.echo(f"secret {namespace}/{secret}: {action}")
            if out_dir is not None:
                write_files(bundle, out_dir)
                typer.echo(f"wrote {out_dir}/tls.crt, tls.key, ca.crt")
            if webhook:
                changed = patch_ca_bundle(client, webhook, bundle.ca_crt)
                typer.echo(f"webhook {webhook}: caBundle "
                           f"{'patched' if changed else 'up to date'}")
    except (ApiError, OSError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


if __name__ == "__main__":  # `python -m hami.certgen`: the command without the `hami` CLI
    typer.run(certgen)
