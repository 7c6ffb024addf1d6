"""The CSR approver's decisions and the signer's checks (podnet.controllers.csrapproval),
and client-certificate authentication (podnet.api.certauth), on certificates the cluster
CA signs."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from podnet.api.certauth import user_of_certificate
from podnet.api.csrrestriction import BOUND_NODE_EXTRA, admit_create
from podnet.api.identity import User
from podnet.api.pki import ensure_pki, issue_leaf, load_ca, san_names, sign_client_certificate
from podnet.controllers.csrapproval import SignError, certificate_for, decide, expired
from podnet.model.csr import CLIENT_SIGNER, KUBELET_CLIENT_SIGNER, encode_request
from podnet.model.errors import ApiError

KEY = ec.generate_private_key(ec.SECP256R1())
NODE_USAGES = ["digital signature", "key encipherment", "client auth"]
CA = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]
BOOTSTRAPPER = User("system:bootstrap:abcdef", ("system:bootstrappers",))


def csr(
    cn: str = "system:node:a",
    orgs: tuple[str, ...] = ("system:nodes",),
    requester: User = BOOTSTRAPPER,
    signer: str = KUBELET_CLIENT_SIGNER,
    usages: list[str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": "r"},
        "spec": {
            "request": encode_request(KEY, cn, orgs),
            "signerName": signer,
            "usages": NODE_USAGES if usages is None else usages,
            "username": "forged",
            "groups": ["system:masters"],
            **spec,
        },
    }
    admit_create(requester, obj)  # the server's stamp of the requester
    return obj


def test_a_bootstrapper_is_approved_for_any_node_when_its_token_is_bound_to_none() -> None:
    decision = decide(csr("system:node:b"))
    assert decision is not None and decision.type == "Approved"


def test_a_bootstrapper_bound_to_a_node_is_approved_for_that_node_only() -> None:
    bound = User(BOOTSTRAPPER.name, BOOTSTRAPPER.groups, bound_node="a")
    assert decide(csr("system:node:a", requester=bound)).type == "Approved"  # type: ignore[union-attr]
    attack = decide(csr("system:node:b", requester=bound))
    assert attack is not None and attack.type == "Denied"
    assert "bound to node a, not b" in attack.message


def test_the_server_sets_the_requester_whatever_the_body_says() -> None:
    bound = User(BOOTSTRAPPER.name, BOOTSTRAPPER.groups, bound_node="a")
    obj = csr(requester=bound, extra={BOUND_NODE_EXTRA: ["b"]}, uid="x")
    assert obj["spec"]["username"] == BOOTSTRAPPER.name
    assert obj["spec"]["groups"] == ["system:bootstrappers"]
    assert obj["spec"]["extra"] == {BOUND_NODE_EXTRA: ["a"]} and "uid" not in obj["spec"]
    unbound = csr(extra={BOUND_NODE_EXTRA: ["b"]})  # a forged binding is dropped
    assert "extra" not in unbound["spec"]


def test_a_node_renews_its_own_certificate_but_not_another_nodes() -> None:
    node_a = User("system:node:a", ("system:nodes",))
    assert decide(csr("system:node:a", requester=node_a)).type == "Approved"  # type: ignore[union-attr]
    with pytest.raises(ApiError) as refused:  # refused at create already
        csr("system:node:b", requester=node_a)
    assert refused.value.code == 403


@pytest.mark.parametrize(
    ("cn", "orgs", "usages"),
    [
        ("system:node:a", ("system:nodes", "system:masters"), None),  # admin's group
        ("system:node:a", ("system:masters",), None),
        ("admin", ("system:nodes",), None),
        ("system:node:a", (), None),
        ("system:node:", ("system:nodes",), None),
        ("system:node:a", ("system:nodes",), ["digital signature", "server auth"]),
        ("system:node:a", ("system:nodes",), ["digital signature"]),
    ],
)
def test_anything_but_a_node_client_certificate_is_never_auto_approved(
    cn: str, orgs: tuple[str, ...], usages: list[str] | None
) -> None:
    decision = decide(csr(cn, orgs, usages=usages))
    assert decision is not None and decision.type == "Denied"


def test_other_signers_and_other_requesters_wait_for_the_admin() -> None:
    assert decide(csr("someone", ("team",), signer=CLIENT_SIGNER)) is None
    someone = User("someone", ("team",))
    assert decide(csr("system:node:a", requester=someone)) is None


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CA:
    return load_ca(ensure_pki(tmp_path_factory.mktemp("pki"), ["127.0.0.1"]))


def _cert(b64: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(b64))


def test_the_signer_issues_a_client_certificate_of_the_request(ca: CA) -> None:
    cert = _cert(certificate_for(csr(), *ca))
    cert.verify_directly_issued_by(ca[0])
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:a"
    assert cert.public_key() == KEY.public_key()
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert dt.timedelta(days=364) < life < dt.timedelta(days=366)
    assert user_of_certificate(cert.public_bytes(serialization.Encoding.DER)) == User(
        "system:node:a", ("system:nodes",)
    )


def test_expiration_seconds_shortens_the_certificate_down_to_ten_minutes(ca: CA) -> None:
    cert = _cert(certificate_for(csr(expirationSeconds=3600), *ca))
    assert cert.not_valid_after_utc - dt.datetime.now(dt.UTC) < dt.timedelta(minutes=61)


@pytest.mark.parametrize(
    ("cn", "orgs", "signer"),
    [
        ("system:node:a", ("system:nodes", "system:masters"), KUBELET_CLIENT_SIGNER),
        ("admin", ("system:masters",), CLIENT_SIGNER),
        ("admin", (), KUBELET_CLIENT_SIGNER),
    ],
)
def test_the_signer_refuses_even_what_an_admin_approved(
    ca: CA, cn: str, orgs: tuple[str, ...], signer: str
) -> None:
    with pytest.raises(SignError):
        certificate_for(csr(cn, orgs, signer=signer), *ca)


def test_the_signer_refuses_weak_keys(ca: CA) -> None:
    obj = csr()
    weak = rsa.generate_private_key(65537, 1024)
    obj["spec"]["request"] = encode_request(weak, "system:node:a", ("system:nodes",))
    with pytest.raises(SignError, match="2048"):
        certificate_for(obj, *ca)


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _without_eku(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "system:node:a")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca_cert.subject)
        .public_key(KEY.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())
    )


def test_client_certificate_authentication_refuses_what_is_not_a_client_certificate(
    ca: CA, tmp_path: Path
) -> None:
    serving, _ = issue_leaf(*ca, "system:node:a", san_names([]), [ExtendedKeyUsageOID.SERVER_AUTH])
    for der, why in [
        (_der(serving), "clientAuth"),
        (_der(_without_eku(*ca)), "clientAuth"),
        (b"junk", "cannot be read"),
    ]:
        with pytest.raises(ApiError, match=why) as refused:
            user_of_certificate(der)
        assert refused.value.code == 401
    masters = sign_client_certificate(
        *ca, "admin", ["system:masters"], KEY.public_key(), dt.timedelta(days=1)
    )
    with pytest.raises(ApiError, match="system:masters"):
        user_of_certificate(_der(masters))


def test_a_revoked_client_certificate_is_refused(ca: CA) -> None:
    cert = sign_client_certificate(
        *ca, "system:node:a", ["system:nodes"], KEY.public_key(), dt.timedelta(days=1)
    )
    assert user_of_certificate(_der(cert), lambda user, serial, when: False).name == "system:node:a"
    with pytest.raises(ApiError, match="revoked"):
        user_of_certificate(_der(cert), lambda user, serial, when: serial == cert.serial_number)


def test_requests_expire_an_hour_after_they_finish_and_a_day_while_pending() -> None:
    now = dt.datetime(2026, 1, 2, 12, tzinfo=dt.UTC)
    pending = csr()
    pending["metadata"]["creationTimestamp"] = "2026-01-02T10:00:00Z"
    assert not expired(pending, now)
    pending["metadata"]["creationTimestamp"] = "2026-01-01T11:59:00Z"
    assert expired(pending, now)
    issued = csr()
    issued["metadata"]["creationTimestamp"] = "2026-01-02T10:00:00Z"
    issued["status"] = {"certificate": "eA=="}
    assert expired(issued, now)
    issued["metadata"]["creationTimestamp"] = "2026-01-02T11:30:00Z"
    assert not expired(issued, now)
    for unreadable in ("soon", "2026-01-01T00:00:00", None):
        issued["metadata"]["creationTimestamp"] = unreadable
        assert not expired(issued, now)
