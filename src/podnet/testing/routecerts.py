"""Certificates and keys for Route tests: a throwaway CA and leaves for route hosts, in PEM.

Built with ``podnet.api.pki`` (EC P-256, the master's own issuing code), so a test's
certificate is what a real CA would give: a CA certificate, and a serving certificate for
the host signed by it, with its key.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from podnet.api.pki import issue_leaf, key_pem, load_or_create_ca


@dataclass(frozen=True)
class RouteCa:
    """A CA that issues route certificates."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def new(cls, name: str = "route-test-ca") -> RouteCa:
        with tempfile.TemporaryDirectory() as scratch:
            where = Path(scratch)
            cert, key = load_or_create_ca(where / "ca.crt", where / "ca.key", name)
        return cls(cert, key)

    @property
    def pem(self) -> str:
        return self.certificate.public_bytes(serialization.Encoding.PEM).decode()

    def issue(self, host: str) -> Leaf:
        """A serving certificate for ``host``, and its key."""
        names: set[x509.IPAddress | x509.DNSName] = {x509.DNSName(host)}
        cert, key = issue_leaf(
            self.certificate, self.key, host, names, [ExtendedKeyUsageOID.SERVER_AUTH]
        )
        return Leaf(cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem(key).decode())


@dataclass(frozen=True)
class Leaf:
    """A certificate and its private key, in PEM."""

    certificate: str
    key: str


def other_key_pem() -> str:
    """A private key that belongs to no certificate (EC, PKCS#8)."""
    return key_pem(ec.generate_private_key(ec.SECP256R1())).decode()


def rsa_key_pem(traditional: bool = True) -> str:
    """An RSA key in the ``RSA PRIVATE KEY`` form (or PKCS#8)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    form = serialization.PrivateFormat.TraditionalOpenSSL if traditional else None
    return key.private_bytes(
        serialization.Encoding.PEM,
        form or serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def encrypted_key_pem() -> str:
    """A private key encrypted with a password (PKCS#8)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    ).decode()
