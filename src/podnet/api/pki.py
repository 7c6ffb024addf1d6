"""TLS material for the API server: a private CA and a serving certificate signed by it.

``ensure_pki`` is safe to re-run on every master start: it keeps the CA (clients trust
it through their kubeconfig) and re-issues only the serving certificate, when it no
longer covers the master's addresses, is close to expiry, or does not match its key.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from podnet.files import write_atomic

CA_COMMON_NAME = "podnet-ca"
SERVER_COMMON_NAME = "podnet-master"
CA_VALIDITY = dt.timedelta(days=3650)
SERVER_VALIDITY = dt.timedelta(days=365)
# Re-issue the serving certificate when less than this is left of it.
RENEW_BEFORE = dt.timedelta(days=30)
# Backdate certificates a little so peers with a slightly slow clock accept them.
CLOCK_SKEW = dt.timedelta(minutes=5)
ALWAYS_HOSTS = ("127.0.0.1", "localhost")

SanName = x509.IPAddress | x509.DNSName


class PkiError(Exception):
    """The PKI directory is in a state ``ensure_pki`` will not repair on its own."""


@dataclass(frozen=True)
class Pki:
    """Paths of the CA and serving certificate, and TLS contexts built from them."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path

    @classmethod
    def at(cls, directory: Path) -> Pki:
        """The file layout under ``directory`` (nothing is read or created)."""
        d = Path(directory)
        return cls(d, d / "ca.crt", d / "ca.key", d / "server.crt", d / "server.key")

    def ca_pem(self) -> bytes:
        """The CA certificate in PEM, as clients put it in their kubeconfig."""
        return self.ca_cert.read_bytes()

    def server_ssl_context(self) -> ssl.SSLContext:
        """A TLS server context presenting the serving certificate (TLS 1.2+) that asks
        for an optional client certificate, verified against the CA (a certificate the
        CA did not sign, or not for client use, fails the handshake); who it names is
        ``podnet.api.certauth``'s to say."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.server_cert, self.server_key)
        ctx.verify_mode = ssl.CERT_OPTIONAL
        ctx.verify_flags |= ssl.VERIFY_X509_STRICT
        ctx.load_verify_locations(cafile=str(self.ca_cert))
        return ctx

    def client_ssl_context(self) -> ssl.SSLContext:
        """A TLS client context that trusts only this CA and checks the host name."""
        return client_ssl_context(self.ca_pem())


def client_ssl_context(ca_pem: bytes) -> ssl.SSLContext:
    """A TLS client context trusting only ``ca_pem`` (host names are checked)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem.decode("ascii"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # Python 3.13's default; set here so older Pythons hold our certificates to it too.
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    return ctx


# ------------------------------------------------------------------------ helpers


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def san_names(hosts: Iterable[str]) -> set[SanName]:
    """SubjectAltNames for ``hosts`` plus 127.0.0.1 and localhost: IPs as IPAddress."""
    out: set[SanName] = set()
    for raw in (*ALWAYS_HOSTS, *hosts):
        host = raw.strip().strip("[]")
        if not host:
            continue
        try:
            out.add(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.add(x509.DNSName(host.lower().rstrip(".")))
    return out


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{path}: expected an EC private key")
    return key


def _same_key(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return cert.public_key().public_bytes(*fmt) == key.public_key().public_bytes(*fmt)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name, key: ec.EllipticCurvePrivateKey, validity: dt.timedelta
) -> x509.CertificateBuilder:
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + validity)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


# ---------------------------------------------------------------------------- CA


def _new_ca(
    common_name: str = CA_COMMON_NAME,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    cert = (
        _builder(_name(common_name), key, CA_VALIDITY)
        .issuer_name(_name(common_name))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _load_or_create_ca(
    pki: Pki, common_name: str = CA_COMMON_NAME
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA's cert and key. Half a CA on disk is an error, not a reason to replace it."""
    have_cert, have_key = pki.ca_cert.exists(), pki.ca_key.exists()
    if have_cert != have_key:
        present = pki.ca_cert if have_cert else pki.ca_key
        raise PkiError(f"{present} exists without its pair; restore it or remove both")
    if have_cert:
        cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
        key = _load_key(pki.ca_key)
        if not _same_key(cert, key):
            raise PkiError(f"{pki.ca_key} does not match {pki.ca_cert}")
        return cert, key
    cert, key = _new_ca(common_name)
    write_atomic(pki.ca_key, _key_pem(key), 0o600)
    write_atomic(pki.ca_cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


# ------------------------------------------------------------------- server cert


def _issue_server(
    ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, names: set[SanName]
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    return issue_leaf(ca_cert, ca_key, SERVER_COMMON_NAME, names, [ExtendedKeyUsageOID.SERVER_AUTH])


def issue_leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    names: set[SanName],
    purposes: Sequence[x509.ObjectIdentifier],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new key and a certificate for it, signed by the CA, for ``purposes`` (EKUs).

    Used for etcd's serving, peer and client certificates (``podnet.store.etcd_pki``).
    """
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        _builder(_name(common_name), key, SERVER_VALIDITY)
        .issuer_name(ca_cert.subject)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(purposes)), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
    )
    if names:
        ordered = sorted(names, key=lambda n: (isinstance(n, x509.DNSName), str(n.value)))
        builder = builder.add_extension(x509.SubjectAlternativeName(ordered), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def load_or_create_ca(
    cert_path: Path, key_path: Path, common_name: str = CA_COMMON_NAME
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA at these paths, created (key 0600) when neither file exists."""
    pki = Pki(cert_path.parent, cert_path, key_path, cert_path, key_path)
    return _load_or_create_ca(pki, common_name)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """``key`` as unencrypted PKCS#8 PEM (write it 0600)."""
    return _key_pem(key)


def cert_san_names(cert: x509.Certificate) -> set[SanName]:
    """The IPAddress and DNSName SubjectAltNames of ``cert``."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {n for n in san if isinstance(n, x509.IPAddress | x509.DNSName)}


def _signed_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _server_reusable(pki: Pki, ca_cert: x509.Certificate, names: set[SanName]) -> bool:
    if not (pki.server_cert.exists() and pki.server_key.exists()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
        key = _load_key(pki.server_key)
    except (ValueError, PkiError):
        return False  # unreadable: replace it, it is ours to re-issue
    return (
        _signed_by(cert, ca_cert)
        and _same_key(cert, key)
        and names <= cert_san_names(cert)
        and cert.not_valid_after_utc - _now() > RENEW_BEFORE
    )


def ensure_pki(directory: Path, hosts: Sequence[str]) -> Pki:
    """Create or reuse the CA and serving certificate under ``directory``.

    The serving certificate names every host (IPs as IPAddress SANs, names as DNSName)
    plus 127.0.0.1 and localhost. An existing one is kept when it covers them, is signed
    by the CA, matches its key and has more than ``RENEW_BEFORE`` left; otherwise it is
    re-issued with the existing CA. Keys are written mode 0600, the directory 0700.
    """
    pki = Pki.at(directory)
    pki.directory.mkdir(parents=True, exist_ok=True)
    os.chmod(pki.directory, 0o700)
    ca_cert, ca_key = _load_or_create_ca(pki)
    names = san_names(hosts)
    if not _server_reusable(pki, ca_cert, names):
        cert, key = _issue_server(ca_cert, ca_key, names)
        # Key first: a crash between the writes leaves a mismatch the next run repairs.
        write_atomic(pki.server_key, _key_pem(key), 0o600)
        write_atomic(pki.server_cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return pki


# ------------------------------------------------------------- client certificates

CLIENT_VALIDITY = dt.timedelta(days=365)  # the signer's default (--cluster-signing-duration)
MIN_CLIENT_VALIDITY = dt.timedelta(minutes=10)  # what spec.expirationSeconds may ask at least
# The shortest --cluster-signing-duration: a node rotates at 70-90 % of a certificate's
# life, so a minute leaves it 6-18 s to get the next one.
MIN_SIGNING_DURATION = dt.timedelta(minutes=1)
SHORT_BACKDATE_DIVISOR = 5  # a short certificate is backdated a fifth of its life at most


def client_validity(
    expiration_seconds: int | None, maximum: dt.timedelta = CLIENT_VALIDITY
) -> dt.timedelta:
    """A client certificate's lifetime: ``maximum`` (the signing duration), or less when
    the CSR asks for less (``spec.expirationSeconds``, never under ten minutes unless
    ``maximum`` itself is shorter)."""
    if expiration_seconds is None:
        return maximum
    asked = dt.timedelta(seconds=expiration_seconds)
    return min(maximum, max(MIN_CLIENT_VALIDITY, asked))


def client_backdate(validity: dt.timedelta) -> dt.timedelta:
    """How far a client certificate's notBefore lies before its issuance: ``CLOCK_SKEW``,
    but at most a fifth of ``validity`` in whole seconds (a one-minute certificate is not
    made six minutes long, which would put its rotation point before its issuance)."""
    seconds = int(validity.total_seconds()) // SHORT_BACKDATE_DIVISOR
    return min(CLOCK_SKEW, dt.timedelta(seconds=seconds))


def issued_at(cert: x509.Certificate) -> dt.datetime:
    """When the signer issued ``cert``: notBefore plus ``client_backdate``, recovered from
    the certificate's span (span = validity + backdate, the backdate a fifth of the
    validity or ``CLOCK_SKEW``: so it is min(CLOCK_SKEW, span // 6), exact in whole
    seconds). A certificate of an older signer (always ``CLOCK_SKEW``) comes out issued
    no later than it was, which errs towards revoking it."""
    span = int((cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds())
    backdate = min(CLOCK_SKEW, dt.timedelta(seconds=span // (SHORT_BACKDATE_DIVISOR + 1)))
    return cert.not_valid_before_utc + backdate


def sign_client_certificate(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    organizations: Sequence[str],
    public_key: ec.EllipticCurvePublicKey | rsa.RSAPublicKey,
    validity: dt.timedelta,
    key_encipherment: bool = False,
) -> x509.Certificate:
    """A client certificate (clientAuth only, no SubjectAltNames) for ``public_key``,
    naming CN ``common_name`` and O ``organizations`` and nothing else of the request,
    valid from ``client_backdate(validity)`` before now until ``validity`` after."""
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    subject = x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=key_encipherment,
        data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    now = _now().replace(microsecond=0)  # whole seconds: ``issued_at`` recovers ``now``
    validity = dt.timedelta(seconds=int(validity.total_seconds()))
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - client_backdate(validity))
        .not_valid_after(now + validity)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def load_ca(pki: Pki) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The cluster CA's certificate and key (``PkiError`` when they are missing)."""
    if not (pki.ca_cert.exists() and pki.ca_key.exists()):
        raise PkiError(f"no CA under {pki.directory}")
    return _load_or_create_ca(pki)
