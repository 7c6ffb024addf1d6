"""A node's renewal of its own client certificate (``podnet.controllers.csrapproval``,
kube's "selfnodeclient" rule): approved when node X asks for CN=system:node:X,
O=system:nodes with client usages only; denied, with the reason, when a node asks for
another node's name, for server auth, or for another group. The signer issues for the
signing duration (``--cluster-signing-duration``), less when the request asks, and a
certificate past its end authenticates no request, even on a connection made before;
its request is removed then (so rotating nodes stay within their request quota)."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from podnet.api.certauth import user_of_certificate
from podnet.api.csrrestriction import admit_create
from podnet.api.identity import User
from podnet.api.pki import ensure_pki, issued_at, load_ca
from podnet.controllers.csrapproval import certificate_for, decide, expired
from podnet.model.csr import KUBELET_CLIENT_SIGNER, encode_request
from podnet.model.errors import ApiError

KEY = ec.generate_private_key(ec.SECP256R1())
CLIENT = ["digital signature", "key encipherment", "client auth"]
NODE_A = User("system:node:a", ("system:nodes",))


def request(
    cn: str, orgs: tuple[str, ...] = ("system:nodes",), usages: list[str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "r"},
        "spec": {
            "request": encode_request(KEY, cn, orgs),
            "signerName": KUBELET_CLIENT_SIGNER,
            "usages": CLIENT if usages is None else usages,
        },
    }


def by(user: User, obj: dict[str, Any]) -> dict[str, Any]:
    admit_create(user, obj)  # the server's stamp of the requester
    return obj


def stamped_only(user: User, obj: dict[str, Any]) -> dict[str, Any]:
    """The requester's stamp without the create-time name check (a request that got
    past it, or one written to the store by other means)."""
    obj["spec"].update(username=user.name, groups=list(user.groups))
    return obj


def test_a_node_renewing_its_own_client_certificate_is_approved() -> None:
    decision = decide(by(NODE_A, request("system:node:a")))
    assert decision is not None and decision.type == "Approved"
    assert decision.reason == "AutoApproved" and "renewal by node a" in decision.message
    fewer = decide(by(NODE_A, request("system:node:a", usages=["client auth"])))
    assert fewer is not None and fewer.type == "Approved"


def test_a_node_asking_for_another_nodes_name_is_refused_and_denied() -> None:
    with pytest.raises(ApiError) as refused:  # the API refuses it at create
        by(NODE_A, request("system:node:b"))
    assert refused.value.code == 403
    decision = decide(stamped_only(NODE_A, request("system:node:b")))  # and the approver
    assert decision is not None and decision.type == "Denied"
    assert decision.reason == "NotOwnNode"
    assert "system:node:a may only renew its own certificate" in decision.message


@pytest.mark.parametrize(
    ("orgs", "usages", "reason"),
    [
        (("system:nodes",), ["digital signature", "client auth", "server auth"], "BadUsages"),
        (("system:nodes",), ["digital signature", "server auth"], "BadUsages"),
        (("system:nodes",), ["digital signature"], "BadUsages"),
        (("system:nodes", "system:masters"), None, "NotANodeSubject"),
        (("system:nodes", "team"), None, "NotANodeSubject"),
    ],
)
def test_a_node_asking_for_more_than_its_client_certificate_is_denied(
    orgs: tuple[str, ...], usages: list[str] | None, reason: str
) -> None:
    decision = decide(by(NODE_A, request("system:node:a", orgs, usages)))
    assert decision is not None and decision.type == "Denied"
    assert decision.reason == reason, decision.message


def test_a_node_user_outside_system_nodes_gets_no_renewal() -> None:
    """The name alone is not a node: without the group, no auto-approval (denied)."""
    impostor = User("system:node:a", ("team",))
    decision = decide(stamped_only(impostor, request("system:node:a")))
    assert decision is not None and decision.type == "Denied"


def test_the_signer_issues_for_the_signing_duration_or_less(tmp_path: Any) -> None:
    ca = load_ca(ensure_pki(tmp_path / "pki", ["127.0.0.1"]))
    minute = dt.timedelta(minutes=1)

    def life(obj: dict[str, Any], duration: dt.timedelta) -> dt.timedelta:
        pem = base64.b64decode(certificate_for(obj, *ca, duration))
        cert = x509.load_pem_x509_certificate(pem)
        return cert.not_valid_after_utc - issued_at(cert)

    renewal = by(NODE_A, request("system:node:a"))
    assert life(renewal, minute) == minute
    assert life(renewal, dt.timedelta(hours=3)) == dt.timedelta(hours=3)
    renewal["spec"]["expirationSeconds"] = 3600
    assert life(renewal, minute) == minute  # never more than the duration
    assert life(renewal, dt.timedelta(days=365)) == dt.timedelta(hours=1)


def test_an_expired_certificate_authenticates_no_request(tmp_path: Any) -> None:
    ca = load_ca(ensure_pki(tmp_path / "pki", ["127.0.0.1"]))
    renewal = by(NODE_A, request("system:node:a"))
    pem = base64.b64decode(certificate_for(renewal, *ca, dt.timedelta(minutes=1)))
    cert = x509.load_pem_x509_certificate(pem)
    der = cert.public_bytes(serialization.Encoding.DER)
    end = cert.not_valid_after_utc
    assert user_of_certificate(der, now=end) == NODE_A
    with pytest.raises(ApiError, match="expired") as refused:
        user_of_certificate(der, now=end + dt.timedelta(seconds=1))
    assert refused.value.code == 401


def test_an_issued_request_goes_once_its_certificate_has_expired(tmp_path: Any) -> None:
    """A node rotating one-minute certificates asks every ~45 s: were its issued
    requests kept an hour, it would hold 80 and pass its quota of 32 (429)."""
    ca = load_ca(ensure_pki(tmp_path / "pki", ["127.0.0.1"]))
    renewal = by(NODE_A, request("system:node:a"))
    renewal["status"] = {"certificate": certificate_for(renewal, *ca, dt.timedelta(minutes=1))}
    cert = x509.load_pem_x509_certificate(base64.b64decode(renewal["status"]["certificate"]))
    renewal["metadata"]["creationTimestamp"] = issued_at(cert).isoformat()
    assert not expired(renewal, cert.not_valid_after_utc)
    assert expired(renewal, cert.not_valid_after_utc + dt.timedelta(seconds=1))
    renewal["status"]["certificate"] = "bm90IGEgY2VydGlmaWNhdGU="  # unreadable: the hour
    assert not expired(renewal, cert.not_valid_after_utc + dt.timedelta(minutes=59))
    assert expired(renewal, issued_at(cert) + dt.timedelta(minutes=61))
