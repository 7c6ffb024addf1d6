"""PEM checks for a Route's TLS material, with the ``cryptography`` package.

Each ``*_problem`` function returns None for good input, or a sentence saying what is
wrong. The sentences never quote the input: a key is a secret, and a certificate field
may hold one pasted by mistake. They name PEM block types and parse failures only.

- ``certificates_problem``: one or more PEM ``CERTIFICATE`` blocks, each a parseable
  X.509 certificate, and no other block (a certificate field holding a private key is
  refused, so the key is not published with the certificate).
- ``key_problem``: exactly one unencrypted PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC)
  whose public key is the certificate's (the first block of ``certificate``).
"""

from __future__ import annotations

import re

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

_BLOCK_RE = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----")
KEY_BLOCKS = frozenset({"PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"})
ENCRYPTED_KEY_BLOCK = "ENCRYPTED PRIVATE KEY"
CERTIFICATE_BLOCK = "CERTIFICATE"


def pem_blocks(text: str) -> list[str]:
    """The types of the PEM blocks in ``text``, in order (``CERTIFICATE``, ...)."""
    return _BLOCK_RE.findall(text)


def _load_certificates(text: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(text.encode("utf-8", "surrogatepass"))


def certificates_problem(text: str) -> str | None:
    """What is wrong with ``text`` as PEM-encoded X.509 certificates, if anything."""
    blocks = pem_blocks(text)
    if not blocks:
        return "must be a PEM-encoded X.509 certificate: no PEM block found"
    others = sorted({b for b in blocks if b != CERTIFICATE_BLOCK})
    if others:
        found = ", ".join(others)
        return f"must hold only CERTIFICATE PEM blocks, found {found}"
    try:
        certificates = _load_certificates(text)
    except (ValueError, UnsupportedAlgorithm):
        return "must be a PEM-encoded X.509 certificate: a CERTIFICATE block does not parse"
    if len(certificates) != len(blocks):
        return "must be a PEM-encoded X.509 certificate: a CERTIFICATE block does not parse"
    return None


def _load_key(text: str) -> PrivateKeyTypes:
    data = text.encode("utf-8", "surrogatepass")
    return serialization.load_pem_private_key(data, password=None)


def _public_der(key: object) -> bytes | None:
    public_bytes = getattr(key, "public_bytes", None)
    if public_bytes is None:
        return None
    der: bytes = public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def key_problem(key: str, certificate: str | None) -> str | None:
    """What is wrong with ``key`` as the private key of ``certificate``, if anything.

    ``certificate`` is checked on its own by ``certificates_problem``; when it does not
    parse, only the key's own form is checked here."""
    blocks = pem_blocks(key)
    if ENCRYPTED_KEY_BLOCK in blocks:
        return "must be an unencrypted PEM private key: the key is encrypted"
    if len(blocks) != 1 or blocks[0] not in KEY_BLOCKS:
        return "must be exactly one PEM private key block (PRIVATE KEY, RSA or EC PRIVATE KEY)"
    try:
        private = _load_key(key)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return "must be a PEM private key: the key block does not parse"
    if not certificate or certificates_problem(certificate):
        return None
    leaf = _load_certificates(certificate)[0]
    if _public_der(private.public_key()) != _public_der(leaf.public_key()):
        return "does not match the certificate: the key is not the certificate's private key"
    return None
