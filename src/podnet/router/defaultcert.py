"""The router's default certificate: what HTTPS clients get for a name no route serves
with a certificate of its own (and without SNI).

``podnet router --default-certificate FILE`` names a PEM with the certificate, its key
and any chain; ``load_default_certificate`` checks it before HAProxy sees it. Without
one, ``ensure_default_certificate`` makes a self-signed one (EC P-256, one year) in the
run directory, mode 0600, kept across restarts while it is valid.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from podnet.files import write_atomic

VALIDITY = dt.timedelta(days=365)
RENEW_BEFORE = dt.timedelta(days=7)


class DefaultCertificateError(ValueError):
    """The default certificate file is unusable (the message says why)."""


def load_default_certificate(path: Path) -> str:
    """The PEM text of ``path`` once it holds a certificate and its private key."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise DefaultCertificateError(f"cannot read the default certificate {path}: {exc}") from exc
    data = text.encode()
    try:
        certificate = x509.load_pem_x509_certificate(data)
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise DefaultCertificateError(
            f"{path} must hold a PEM certificate and its unencrypted private key: {exc}"
        ) from exc
    if key.public_key() != certificate.public_key():
        raise DefaultCertificateError(f"the key in {path} is not the certificate's key")
    return text


def ensure_default_certificate(path: Path, common_name: str) -> Path:
    """A self-signed certificate and key at ``path`` (made when missing, unreadable or
    about to expire)."""
    try:
        text = load_default_certificate(path)
        certificate = x509.load_pem_x509_certificate(text.encode())
        if certificate.not_valid_after_utc - _now() > RENEW_BEFORE:
            return path
    except DefaultCertificateError:
        pass
    write_atomic(path, self_signed_pem(common_name), 0o600)
    return path


def self_signed_pem(common_name: str, key: CertificateIssuerPrivateKeyTypes | None = None) -> bytes:
    """A self-signed serving certificate for ``common_name`` and its key (a new EC P-256
    one unless given), as one PEM: the certificate first."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(common_name)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return certificate.public_bytes(serialization.Encoding.PEM) + key_pem


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
