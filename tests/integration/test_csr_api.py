"""TLS bootstrap against a real API server (TLS, tokens, authorizer, in-memory store):
a bootstrapper asks for a node client certificate through a CertificateSigningRequest,
the master's approver and signer issue it, and the certificate authenticates the node.

Attack tests: a bootstrapper sees and touches nothing but its own requests; a token
bound to node a gets no certificate for node b; system:masters is never signed; a node
certificate cannot act as another node or as the admin; a certificate the CA did not
sign, or a serving certificate, is refused; bad requests change nothing.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from podnet.api.auth import TokenFile, add_token, ensure_admin_token, ensure_node_token
from podnet.api.csrrestriction import MAX_PER_REQUESTER
from podnet.api.identity import BOOTSTRAPPERS_GROUP, User
from podnet.api.pki import Pki, ensure_pki, issue_leaf, key_pem, load_ca, san_names
from podnet.api.registry import Registry
from podnet.api.server import ApiServer
from podnet.controllers import csrsigner
from podnet.controllers.csrsigner import CsrSigner
from podnet.model.csr import CLIENT_SIGNER, KUBELET_CLIENT_SIGNER, encode_request
from podnet.store.memory import MemoryStore
from podnet.testing.api import node

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
USAGES = ["digital signature", "key encipherment", "client auth"]
BOUND = "system:bootstrap:boundaa"


class BoundTokens(TokenFile):
    """The token file, with the user ``BOUND`` bound to node a (as a bootstrap token)."""

    def authenticate(self, authorization_header: str | None) -> User:
        user = super().authenticate(authorization_header)
        return replace(user, bound_node="a") if user.name == BOUND else user


@dataclass
class Cluster:
    server: ApiServer
    signer: CsrSigner
    pki: Pki
    tmp: Path
    tokens: dict[str, str]

    def client(
        self, token: str | None = None, cert: tuple[Path, Path] | None = None
    ) -> httpx.AsyncClient:
        context = ssl.create_default_context(cadata=self.pki.ca_pem().decode())
        if cert is not None:
            context.load_cert_chain(*cert)
        headers = {"Authorization": f"Bearer {self.tokens[token]}"} if token else {}
        return httpx.AsyncClient(base_url=self.server.address, verify=context, headers=headers)

    async def request(self, who: str, method: str, path: str, **kw: Any) -> httpx.Response:
        async with self.client(who) as client:
            return await client.request(method, path, **kw)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    registry = Registry(MemoryStore(), prefix="/t/")
    path = tmp_path / "tokens.csv"
    tokens = {
        "admin": ensure_admin_token(path),
        "node-a": ensure_node_token(path, "a"),
        "boot": add_token(path, "system:bootstrap:abcdef", [BOOTSTRAPPERS_GROUP]),
        "boot2": add_token(path, "system:bootstrap:ghijkl", [BOOTSTRAPPERS_GROUP]),
        "bound": add_token(path, BOUND, [BOOTSTRAPPERS_GROUP]),
    }
    pki = ensure_pki(tmp_path / "pki", ["127.0.0.1"])
    server = ApiServer(registry, BoundTokens(path))
    await server.start("127.0.0.1", 0, pki.server_ssl_context())
    signer = CsrSigner(registry, load_ca(pki))
    try:
        yield Cluster(server, signer, pki, tmp_path, tokens)
    finally:
        await server.stop()


KEY = ec.generate_private_key(ec.SECP256R1())


def csr_body(
    name: str,
    cn: str = "system:node:a",
    orgs: tuple[str, ...] = ("system:nodes",),
    signer: str = KUBELET_CLIENT_SIGNER,
    key: ec.EllipticCurvePrivateKey = KEY,
) -> dict[str, Any]:
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": encode_request(key, cn, orgs),
            "signerName": signer,
            "usages": USAGES,
            "username": "admin",  # ignored: the server sets the requester
            "groups": ["system:masters"],
        },
    }


def write_pair(where: Path, name: str, cert_pem: bytes, key: Any) -> tuple[Path, Path]:
    cert_path, key_path = where / f"{name}.crt", where / f"{name}.key"
    cert_path.write_bytes(cert_pem)
    key_path.write_bytes(key_pem(key))
    return cert_path, key_path


async def issued(c: Cluster, who: str, name: str) -> bytes | None:
    await c.signer.sync()
    got = await c.request(who, "GET", f"{CSRS}/{name}")
    assert got.status_code == 200, got.text
    cert = (got.json().get("status") or {}).get("certificate")
    return base64.b64decode(cert) if cert else None


async def test_a_bootstrapper_gets_a_node_certificate_that_authenticates_the_node(
    cluster: Cluster,
) -> None:
    made = await cluster.request("boot", "POST", CSRS, json=csr_body("a-1"))
    assert made.status_code == 201, made.text
    spec = made.json()["spec"]
    assert (spec["username"], spec["groups"]) == (
        "system:bootstrap:abcdef",
        ["system:bootstrappers"],
    )
    pem = await issued(cluster, "boot", "a-1")
    assert pem is not None
    conditions = (await cluster.request("admin", "GET", f"{CSRS}/a-1")).json()["status"][
        "conditions"
    ]
    assert [(c["type"], c["reason"]) for c in conditions] == [("Approved", "AutoApproved")]
    pair = write_pair(cluster.tmp, "a", pem, KEY)
    async with cluster.client(cert=pair) as as_node:
        assert (await as_node.post("/api/v1/nodes", json=node("a", "192.0.2.1"))).status_code == 201
        other = await as_node.post("/api/v1/nodes", json=node("b", "192.0.2.2"))
        assert other.status_code == 403, other.text  # NodeRestriction: not another node
        admin_only = await as_node.post("/api/v1/namespaces", json={"metadata": {"name": "x"}})
        assert admin_only.status_code == 403
        assert (await as_node.get(f"{CSRS}/a-1")).status_code == 403  # not its request
        # renewal: the node asks in its own name, and only in its own name
        renew = await as_node.post(CSRS, json=csr_body("a-2"))
        assert renew.status_code == 201 and renew.json()["spec"]["username"] == "system:node:a"
        forged = await as_node.post(CSRS, json=csr_body("b-1", "system:node:b"))
        assert forged.status_code == 403, forged.text
    assert await issued(cluster, "admin", "a-2") is not None


async def test_a_bootstrapper_may_only_ask_and_read_its_own(cluster: Cluster) -> None:
    assert (await cluster.request("boot", "POST", CSRS, json=csr_body("mine"))).status_code == 201
    assert (
        await cluster.request("boot2", "POST", CSRS, json=csr_body("theirs"))
    ).status_code == 201
    for method, path in [
        ("GET", "/api/v1/pods"),
        ("GET", "/api/v1/nodes"),
        ("POST", "/api/v1/nodes"),
        ("GET", f"{CSRS}/theirs"),
        ("GET", f"{CSRS}/missing"),
        ("DELETE", f"{CSRS}/mine"),
        ("PUT", f"{CSRS}/mine/approval"),
        ("PUT", f"{CSRS}/mine/status"),
    ]:
        sent = csr_body("mine") if method == "PUT" else node("a", "192.0.2.1")
        body = {"json": sent} if method in ("POST", "PUT") else {}
        got = await cluster.request("boot", method, path, **body)
        assert got.status_code == 403, (method, path, got.text)
    listed = await cluster.request("boot", "GET", CSRS)
    assert [o["metadata"]["name"] for o in listed.json()["items"]] == ["mine"]
    everything = await cluster.request("admin", "GET", CSRS)
    assert len(everything.json()["items"]) == 2
    watched = await cluster.request(
        "boot", "GET", CSRS, params={"watch": "1", "timeoutSeconds": "1"}
    )
    events = [json.loads(line) for line in watched.text.splitlines() if line.strip()]
    assert [e["object"]["metadata"]["name"] for e in events] == ["mine"], watched.text


async def test_a_token_bound_to_node_a_gets_no_certificate_for_node_b(cluster: Cluster) -> None:
    assert (
        await cluster.request("bound", "POST", CSRS, json=csr_body("b", "system:node:b"))
    ).status_code == 201
    assert await issued(cluster, "bound", "b") is None
    status = (await cluster.request("admin", "GET", f"{CSRS}/b")).json()["status"]
    assert status["conditions"][0]["type"] == "Denied"
    assert (
        await cluster.request("bound", "POST", CSRS, json=csr_body("a", "system:node:a"))
    ).status_code == 201
    assert await issued(cluster, "bound", "a") is not None


async def test_a_request_cannot_be_created_approved(cluster: Cluster) -> None:
    body = csr_body("pre", "dev-user", ("team-a",), signer=CLIENT_SIGNER)
    body["status"] = {
        "conditions": [{"type": "Approved", "status": "True", "reason": "Forged"}],
        "certificate": base64.b64encode(b"forged").decode(),
    }
    made = await cluster.request("boot", "POST", CSRS, json=body)
    assert made.status_code == 201 and "status" not in made.json(), made.text
    assert await issued(cluster, "boot", "pre") is None  # still waits for the admin


async def test_system_masters_is_never_signed_even_when_the_admin_approves(
    cluster: Cluster,
) -> None:
    body = csr_body("masters", "admin", ("system:masters",), signer=CLIENT_SIGNER)
    assert (await cluster.request("boot", "POST", CSRS, json=body)).status_code == 201
    assert await issued(cluster, "boot", "masters") is None  # pending: nobody approved
    current = (await cluster.request("admin", "GET", f"{CSRS}/masters")).json()
    current["status"] = {"conditions": [{"type": "Approved", "status": "True", "reason": "Admin"}]}
    approved = await cluster.request("admin", "PUT", f"{CSRS}/masters/approval", json=current)
    assert approved.status_code == 200, approved.text
    assert await issued(cluster, "admin", "masters") is None
    types = [
        c["type"]
        for c in (await cluster.request("admin", "GET", f"{CSRS}/masters")).json()["status"][
            "conditions"
        ]
    ]
    assert types == ["Approved", "Failed"]


async def test_the_admin_approves_a_pending_client_certificate(cluster: Cluster) -> None:
    body = csr_body("dev", "dev-user", ("team-a",), signer=CLIENT_SIGNER)
    assert (await cluster.request("boot", "POST", CSRS, json=body)).status_code == 201
    assert await issued(cluster, "admin", "dev") is None
    current = (await cluster.request("admin", "GET", f"{CSRS}/dev")).json()
    # the certificate cannot be written before approval, nor by anyone but the admin
    current["status"] = {"certificate": base64.b64encode(b"x").decode()}
    early = await cluster.request("admin", "PUT", f"{CSRS}/dev/status", json=current)
    assert early.status_code == 422, early.text
    current["status"] = {"conditions": [{"type": "Approved", "status": "True"}]}
    assert (
        await cluster.request("admin", "PUT", f"{CSRS}/dev/approval", json=current)
    ).status_code == 200
    pem = await issued(cluster, "admin", "dev")
    assert pem is not None
    # a decision stays: Denied may not replace Approved
    current = (await cluster.request("admin", "GET", f"{CSRS}/dev")).json()
    current["status"]["conditions"] = [{"type": "Denied", "status": "True"}]
    assert (
        await cluster.request("admin", "PUT", f"{CSRS}/dev/approval", json=current)
    ).status_code == 422
    async with cluster.client(cert=write_pair(cluster.tmp, "dev", pem, KEY)) as dev:
        assert (await dev.get("/api/v1/pods")).status_code == 403  # authenticated, no role
        assert (await dev.get("/version")).status_code == 200


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"signerName": "example.com/anything"}, "unknown signer"),
        ({"request": "not base64!"}, "base64"),
        (
            {
                "request": base64.b64encode(
                    b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n"
                    b"-----END CERTIFICATE REQUEST-----\n"
                ).decode()
            },
            "PKCS#10",
        ),
        ({"usages": ["client auth", "server auth"]}, "server auth"),
        ({"usages": ["digital signature"]}, "client auth"),
        ({"expirationSeconds": 60}, "between 600"),
    ],
)
async def test_bad_requests_are_refused_and_change_nothing(
    cluster: Cluster, change: dict[str, Any], why: str
) -> None:
    body = csr_body("bad")
    body["spec"].update(change)
    refused = await cluster.request("boot", "POST", CSRS, json=body)
    assert refused.status_code == 422, refused.text
    assert why in refused.text
    assert (await cluster.request("admin", "GET", CSRS)).json()["items"] == []


async def test_a_request_whose_signature_does_not_verify_is_refused(cluster: Cluster) -> None:
    body = csr_body("forged")
    pem = bytearray(base64.b64decode(body["spec"]["request"]))
    der = x509.load_pem_x509_csr(bytes(pem)).public_bytes(serialization.Encoding.DER)
    tampered = der[:-3] + bytes([der[-3] ^ 1]) + der[-2:]  # inside the signature
    body["spec"]["request"] = base64.b64encode(
        x509.load_der_x509_csr(tampered).public_bytes(serialization.Encoding.PEM)
    ).decode()
    refused = await cluster.request("boot", "POST", CSRS, json=body)
    assert refused.status_code == 422 and "signature" in refused.text, refused.text


def _foreign_client_cert(
    signed_by: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
    eku: bool = True,
) -> tuple[bytes, Any]:
    """A client certificate for system:node:a, self-signed or signed by ``signed_by``,
    with the clientAuth usage or no extended key usage at all."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "system:node:a")])
    issuer, signing_key = (signed_by[0].subject, signed_by[1]) if signed_by else (name, key)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
    )
    if eku:
        usage = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])
        builder = builder.add_extension(usage, critical=False)
    if signed_by:
        ski = signed_by[0].extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
        builder = builder.add_extension(aki, critical=False)
    cert = builder.sign(signing_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), key


async def test_certificates_the_ca_did_not_issue_for_clients_are_refused(cluster: Cluster) -> None:
    foreign = write_pair(cluster.tmp, "foreign", *_foreign_client_cert())
    serving = (cluster.pki.server_cert, cluster.pki.server_key)  # the master's own
    for pair in (foreign, serving):
        async with cluster.client("admin", cert=pair) as client:  # a token does not help
            with pytest.raises(httpx.HTTPError):
                await client.get("/api/v1/pods")
    ca_cert, ca_key = load_ca(cluster.pki)
    no_usage = _foreign_client_cert(signed_by=load_ca(cluster.pki), eku=False)
    async with cluster.client(cert=write_pair(cluster.tmp, "no-eku", *no_usage)) as client:
        refused = await client.get("/api/v1/pods")
        assert refused.status_code == 401 and "clientAuth" in refused.text, refused.text
    cert, key = issue_leaf(
        ca_cert,
        ca_key,
        "system:node:a",
        san_names([]),
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CODE_SIGNING],
    )
    pair = write_pair(cluster.tmp, "serverish", cert.public_bytes(serialization.Encoding.PEM), key)
    with contextlib.suppress(httpx.HTTPError):
        async with cluster.client("admin", cert=pair) as client:
            got = await client.get("/api/v1/pods")
            assert got.status_code == 401, got.text  # if TLS let it through: refused here
    async with cluster.client("admin") as client:  # the token alone still works
        assert (await client.get("/api/v1/pods")).status_code == 200


async def test_a_requester_holds_a_bounded_number_of_requests_which_expire(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(MAX_PER_REQUESTER):
        made = await cluster.request("boot", "POST", CSRS, json=csr_body(f"r{i}"))
        assert made.status_code == 201, made.text
    over = await cluster.request("boot", "POST", CSRS, json=csr_body("over"))
    assert over.status_code == 429 and "at most" in over.text, over.text
    assert (await cluster.request("boot2", "POST", CSRS, json=csr_body("other"))).status_code == 201
    monkeypatch.setattr(csrsigner, "expired", lambda obj, now: True)
    await cluster.signer.sync()
    assert (await cluster.request("admin", "GET", CSRS)).json()["items"] == []
