"""CertificateSigningRequests: the signers podnet serves and reading a request's PKCS#10.

Pure functions shared by the schema (``schemas_certificates``), the approver and the
signer (``podnet.controllers.csrsigning``). A CSR's ``spec.request`` is base64 of a PEM
``CERTIFICATE REQUEST``; its self-signature must verify.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

# The signers of client certificates for podnet's own API (kube's names and meanings).
KUBELET_CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client"
SIGNERS = (KUBELET_CLIENT_SIGNER, CLIENT_SIGNER)
# What a client certificate of these signers may be used for; "client auth" is required.
CLIENT_USAGES = frozenset({"digital signature", "key encipherment", "client auth"})
CLIENT_AUTH = "client auth"
# Kubernetes' key usages, as spelled in spec.usages.
KNOWN_USAGES = (
    "signing", "digital signature", "content commitment", "key encipherment",
    "key agreement", "data encipherment", "cert sign", "crl sign", "encipher only",
    "decipher only", "any", "server auth", "client auth", "code signing",
    "email protection", "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user",
    "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc",
)  # fmt: skip
MIN_EXPIRATION_SECONDS = 600  # kube's minimum for spec.expirationSeconds
MAX_REQUEST_BYTES = 64 * 1024
APPROVED, DENIED, FAILED = "Approved", "Denied", "Failed"
DECISIONS = frozenset({APPROVED, DENIED})


class CsrError(ValueError):
    """A request that is not a usable PKCS#10 certificate signing request."""


@dataclass(frozen=True)
class Subject:
    """A request's subject as the API reads a certificate: CN the user, O the groups."""

    common_name: str
    organizations: tuple[str, ...]


def parse_request(encoded: str) -> x509.CertificateSigningRequest:
    """The CSR in ``spec.request`` (base64 PEM); ``CsrError`` says what is wrong."""
    if len(encoded) > MAX_REQUEST_BYTES:
        raise CsrError(f"must be at most {MAX_REQUEST_BYTES} bytes")
    try:
        pem = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CsrError("must be base64 (of a PEM CERTIFICATE REQUEST)") from exc
    if b"-----BEGIN CERTIFICATE REQUEST-----" not in pem:
        raise CsrError("must hold a PEM block of type CERTIFICATE REQUEST")
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError as exc:
        raise CsrError(f"is not a PKCS#10 certificate request: {exc}") from exc
    try:
        valid = csr.is_signature_valid
    except Exception as exc:  # unsupported key or signature algorithm
        raise CsrError(f"its signature cannot be checked: {exc}") from exc
    if not valid:
        raise CsrError("its self-signature does not verify")
    return csr


def subject_of(csr: x509.CertificateSigningRequest | x509.Certificate) -> Subject:
    """CN and O of a request or certificate (``CsrError`` for a non-string value)."""
    try:
        cns = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        orgs = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    except ValueError as exc:
        raise CsrError(f"unreadable subject: {exc}") from exc
    if len(cns) != 1 or not isinstance(cns[0], str):
        raise CsrError("the subject must have exactly one common name (CN)")
    return Subject(cns[0], tuple(str(o) for o in orgs))


def usages_problem(signer: str, usages: Sequence[str]) -> str | None:
    """Why ``usages`` do not fit a client certificate of ``signer``, or None."""
    if signer not in SIGNERS:
        return None
    extra = sorted(set(usages) - CLIENT_USAGES)
    if extra:
        allowed = ", ".join(f'"{u}"' for u in sorted(CLIENT_USAGES))
        return f"{signer} signs only {allowed}, not {', '.join(extra)}"
    if CLIENT_AUTH not in usages:
        return f'{signer} signs client certificates: usages must include "client auth"'
    return None


def conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The CSR's status conditions (malformed entries left out)."""
    status = obj.get("status")
    found = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in found or [] if isinstance(c, Mapping)]


def has_condition(obj: Mapping[str, Any], kind: str) -> bool:
    """Whether the CSR has condition ``kind`` (Approved, Denied, Failed) set to True."""
    return any(c.get("type") == kind and c.get("status", "True") == "True" for c in conditions(obj))


def certificate_of(obj: Mapping[str, Any]) -> str | None:
    """``status.certificate`` (base64 PEM), or None before it is issued."""
    status = obj.get("status")
    cert = status.get("certificate") if isinstance(status, Mapping) else None
    return cert if isinstance(cert, str) and cert else None


def encode_request(
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey,
    common_name: str,
    organizations: Sequence[str] = (),
) -> str:
    """A PKCS#10 request for ``key`` with subject O=organizations, CN=common_name, as
    ``spec.request`` holds it (base64 of the PEM)."""
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    subject = x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    return base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode("ascii")
