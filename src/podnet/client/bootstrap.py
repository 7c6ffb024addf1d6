"""TLS bootstrap, the node's side: from a bootstrap kubeconfig (server, CA, bootstrap
token) to a node kubeconfig holding a client certificate (kubelet's TLS bootstrap).

``bootstrap_node`` makes a new EC P-256 key (written 0600 before anything is sent),
asks for a client certificate for ``system:node:<name>`` in ``system:nodes`` through a
CertificateSigningRequest (signer ``kubernetes.io/kube-apiserver-client-kubelet``),
waits until the master's approver and signer issue it (or deny it: an error that says
why), and writes a kubeconfig with ``client-certificate-data`` and ``client-key-data``
(0600). The bootstrap token is not in it.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from podnet.api.identity import NODES_GROUP, node_user
from podnet.api.pki import key_pem
from podnet.client.aio import AsyncApiClient
from podnet.client.errors import StatusError
from podnet.files import write_atomic
from podnet.kubeconfig import ClientConfig, kubeconfig_document
from podnet.model.csr import (
    CLIENT_USAGES,
    DENIED,
    FAILED,
    KUBELET_CLIENT_SIGNER,
    certificate_of,
    conditions,
    encode_request,
)
from podnet.model.kinds import CERTIFICATE_SIGNING_REQUEST as CSR

POLL_SECONDS = 0.5


class BootstrapError(Exception):
    """The certificate was not issued: denied, failed, or not in time."""


def load_or_create_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The node's key at ``path`` (kept across retries), else a new one written 0600."""
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if isinstance(key, ec.EllipticCurvePrivateKey):
            return key
    key = ec.generate_private_key(ec.SECP256R1())
    write_atomic(path, key_pem(key), 0o600)
    return key


def csr_object(node: str, key: ec.EllipticCurvePrivateKey) -> dict[str, Any]:
    """The CertificateSigningRequest of node ``node``'s client certificate."""
    return {
        "apiVersion": CSR.api_version,
        "kind": CSR.kind,
        "metadata": {"name": f"node-{node}-{uuid.uuid4().hex[:8]}"},
        "spec": {
            "request": encode_request(key, node_user(node), (NODES_GROUP,)),
            "signerName": KUBELET_CLIENT_SIGNER,
            "usages": sorted(CLIENT_USAGES),
        },
    }


def _refusal(obj: dict[str, Any]) -> str | None:
    for cond in conditions(obj):
        if cond.get("type") in (DENIED, FAILED) and cond.get("status", "True") == "True":
            return f"{cond.get('type')}: {cond.get('reason', '')} {cond.get('message', '')}"
    return None


async def request_certificate(
    client: AsyncApiClient, node: str, key: ec.EllipticCurvePrivateKey, timeout: float
) -> bytes:
    """Submit the CSR and wait for its certificate (PEM); ``BootstrapError`` if refused."""
    try:
        created = await client.create(CSR, csr_object(node, key))
    except StatusError as exc:
        raise BootstrapError(f"the master refused the CertificateSigningRequest: {exc}") from exc
    name = created["metadata"]["name"]
    deadline = time.monotonic() + timeout
    while True:
        obj = await client.get(CSR, None, name)
        issued = certificate_of(obj)
        if issued is not None:
            pem = base64.b64decode(issued)
            cert = x509.load_pem_x509_certificate(pem)
            if cert.public_key() != key.public_key():
                raise BootstrapError(f"the certificate of {name} is not for this node's key")
            return pem
        refused = _refusal(obj)
        if refused is not None:
            raise BootstrapError(f"CertificateSigningRequest {name} was not signed: {refused}")
        if time.monotonic() > deadline:
            raise BootstrapError(
                f"CertificateSigningRequest {name} was not signed in {timeout:.0f} s: "
                f"approve it with `kubectl certificate approve {name}`"
            )
        await asyncio.sleep(POLL_SECONDS)


def node_kubeconfig(server: str, ca_pem: bytes, node: str, cert_pem: bytes, key_pem_: bytes) -> str:
    """A kubeconfig for node ``node`` that authenticates by its client certificate."""
    doc = kubeconfig_document(server, ca_pem, "", node_user(node))
    doc["users"][0]["user"] = {
        "client-certificate-data": base64.b64encode(cert_pem).decode(),
        "client-key-data": base64.b64encode(key_pem_).decode(),
    }
    return yaml.safe_dump(doc, sort_keys=False)


async def bootstrap_node(
    bootstrap: ClientConfig,
    node: str,
    key_path: Path,
    out: Path,
    timeout: float = 300.0,
    server: str | None = None,
) -> Path:
    """Get node ``node`` a client certificate with the bootstrap credentials and write
    its kubeconfig to ``out`` (0600), naming ``server`` (default: the bootstrap's; a
    joining host names its local API relay); the key stays at ``key_path`` (0600)."""
    if bootstrap.ca_data is None:
        raise BootstrapError("the bootstrap kubeconfig must name the cluster's CA")
    key = load_or_create_key(key_path)
    client = AsyncApiClient(bootstrap)
    try:
        cert_pem = await request_certificate(client, node, key, timeout)
    finally:
        await client.close()
    named = server or bootstrap.server
    text = node_kubeconfig(named, bootstrap.ca_data, node, cert_pem, key_pem(key))
    write_atomic(out, text, 0o600)
    return out
