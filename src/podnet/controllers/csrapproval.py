"""The CSR approver and signer's decisions, as pure functions (kube's csrapproving and
csrsigning controllers, for the client certificates of podnet's API).

``decide`` auto-approves exactly a node's client certificate: signer
``kubernetes.io/kube-apiserver-client-kubelet``, subject exactly CN=system:node:<name>,
O=system:nodes, usages within digital signature, key encipherment and client auth (client
auth included), asked by a bootstrapper whose token is bound to <name> or to no node, or
by node <name> itself (renewal: kube's "selfnodeclient" rule, requester name = subject
CN). It denies, with a reason, such a request whose requester may not have it (a token
bound elsewhere; a node asking in another node's name); anything else stays pending for
the admin (``kubectl certificate approve|deny``).

``expired`` says when a request is removed (kube's csrcleaner, whose rule for an issued
certificate that has expired keeps the requests of a node rotating short-lived
certificates within its quota). ``certificate_for`` signs
an Approved request with the cluster CA for the signing duration (``podnet master
--cluster-signing-duration``, or less when the request asks), after checking it
again whoever approved it: never a certificate for ``system:masters``; a node signer's
subject must be a node's; the public key EC (P-256/P-384) or RSA of 2048 bits or more.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from podnet.api.csrrestriction import BOUND_NODE_EXTRA
from podnet.api.identity import BOOTSTRAPPERS_GROUP, MASTERS_GROUP, NODE_USER_PREFIX, NODES_GROUP
from podnet.api.pki import CLIENT_VALIDITY, client_validity, sign_client_certificate
from podnet.model.csr import (
    CLIENT_SIGNER,
    DENIED,
    FAILED,
    KUBELET_CLIENT_SIGNER,
    CsrError,
    Subject,
    certificate_of,
    has_condition,
    parse_request,
    subject_of,
    usages_problem,
)

APPROVE, DENY = "Approved", "Denied"
MIN_RSA_BITS = 2048
# How long a request is kept (kube's csrcleaner): finished ones an hour, pending a day.
FINISHED_TTL = dt.timedelta(hours=1)
PENDING_TTL = dt.timedelta(hours=24)


@dataclass(frozen=True)
class Decision:
    """Approved or Denied, and why (the condition's reason and message)."""

    type: str
    reason: str
    message: str


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _node_of(subject: Subject) -> str | None:
    """The node a subject names, when it is exactly a node's (CN, O=system:nodes)."""
    name = subject.common_name.removeprefix(NODE_USER_PREFIX)
    exact = subject.common_name.startswith(NODE_USER_PREFIX) and name
    return name if exact and subject.organizations == (NODES_GROUP,) else None


def _bound_node(spec: Mapping[str, Any]) -> str | None:
    extra = spec.get("extra")
    values = extra.get(BOUND_NODE_EXTRA) if isinstance(extra, Mapping) else None
    return str(values[0]) if isinstance(values, list) and values else None


def decide(obj: Mapping[str, Any]) -> Decision | None:
    """Approve, deny, or None: leave the request to the admin."""
    spec = _spec(obj)
    if spec.get("signerName") != KUBELET_CLIENT_SIGNER:
        return None
    try:
        subject = subject_of(parse_request(str(spec.get("request", ""))))
    except CsrError as exc:
        return Decision(DENY, "BadRequest", f"the certificate request {exc}")
    node = _node_of(subject)
    if node is None:
        return Decision(
            DENY,
            "NotANodeSubject",
            f"{KUBELET_CLIENT_SIGNER} signs only CN=system:node:<name>, O={NODES_GROUP}",
        )
    usages = [str(u) for u in spec.get("usages") or []]
    problem = usages_problem(KUBELET_CLIENT_SIGNER, usages)
    if problem:
        return Decision(DENY, "BadUsages", problem)
    username, groups = spec.get("username"), spec.get("groups") or []
    if BOOTSTRAPPERS_GROUP in groups:
        bound = _bound_node(spec)
        if bound is not None and bound != node:
            return Decision(
                DENY,
                "NotBoundNode",
                f"the bootstrap token is bound to node {bound}, not {node}",
            )
        return Decision(APPROVE, "AutoApproved", f"bootstrap of node {node}")
    if username == f"{NODE_USER_PREFIX}{node}" and NODES_GROUP in groups:
        return Decision(APPROVE, "AutoApproved", f"renewal by node {node}")
    if NODES_GROUP in groups or str(username).startswith(NODE_USER_PREFIX):
        return Decision(
            DENY,
            "NotOwnNode",
            f"{username} may only renew its own certificate, not {subject.common_name}'s",
        )
    return None  # someone else asks for a node's certificate: the admin decides


class SignError(ValueError):
    """An approved request podnet will not sign (it gets a Failed condition)."""


def _checked_key(
    csr: x509.CertificateSigningRequest,
) -> ec.EllipticCurvePublicKey | rsa.RSAPublicKey:
    key = csr.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1 | ec.SECP384R1):
            raise SignError(f"unsupported elliptic curve {key.curve.name}")
        return key
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise SignError(f"an RSA key must have at least {MIN_RSA_BITS} bits")
        return key
    raise SignError("the key must be EC (P-256, P-384) or RSA")


def certificate_for(
    obj: Mapping[str, Any],
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    duration: dt.timedelta = CLIENT_VALIDITY,
) -> str:
    """``status.certificate`` (base64 PEM) for an Approved request, valid ``duration`` or
    what ``spec.expirationSeconds`` asks when that is less; ``SignError`` if not."""
    spec = _spec(obj)
    signer = spec.get("signerName")
    if signer not in (KUBELET_CLIENT_SIGNER, CLIENT_SIGNER):
        raise SignError(f"podnet does not sign for {signer}")
    try:
        csr = parse_request(str(spec.get("request", "")))
        subject = subject_of(csr)
    except CsrError as exc:
        raise SignError(f"the certificate request {exc}") from exc
    if MASTERS_GROUP in subject.organizations:
        raise SignError(f"podnet never signs a certificate for the group {MASTERS_GROUP}")
    if not subject.common_name:
        raise SignError("the subject's common name is empty")
    if signer == KUBELET_CLIENT_SIGNER and _node_of(subject) is None:
        raise SignError(f"{signer} signs only CN=system:node:<name>, O={NODES_GROUP}")
    usages = [str(u) for u in spec.get("usages") or []]
    problem = usages_problem(str(signer), usages)
    if problem:
        raise SignError(problem)
    expiration = spec.get("expirationSeconds")
    cert = sign_client_certificate(
        ca_cert,
        ca_key,
        subject.common_name,
        subject.organizations,
        _checked_key(csr),
        client_validity(expiration if isinstance(expiration, int) else None, duration),
        key_encipherment="key encipherment" in usages,
    )
    return base64.b64encode(cert.public_bytes(serialization.Encoding.PEM)).decode("ascii")


@functools.lru_cache(maxsize=4096)
def _not_after(certificate: str) -> dt.datetime | None:
    """The notAfter of ``status.certificate`` (base64 PEM); None if unreadable."""
    try:
        return x509.load_pem_x509_certificate(base64.b64decode(certificate)).not_valid_after_utc
    except ValueError:
        return None


def expired(obj: Mapping[str, Any], now: dt.datetime) -> bool:
    """Whether the request has been kept long enough: an hour once issued, denied or
    failed, a day while pending (from its creation; an unreadable time: not expired);
    an issued one also once its certificate has expired (kube's csrcleaner: a node
    rotating one-minute certificates then holds two or three requests, not sixty)."""
    issued = certificate_of(obj)
    end = _not_after(issued) if issued else None
    if end is not None and end < now:
        return True
    meta = obj.get("metadata")
    created = meta.get("creationTimestamp") if isinstance(meta, Mapping) else None
    try:
        born = dt.datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    except ValueError:
        return False
    if born.tzinfo is None:
        return False
    finished = issued or has_condition(obj, DENIED) or has_condition(obj, FAILED)
    return now - born > (FINISHED_TTL if finished else PENDING_TTL)
