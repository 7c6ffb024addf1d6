"""Discovery for a joining host (kubeadm's ``cluster-info``): ``GET /cluster-info``, public,
answers the cluster CA and the masters' addresses.

A host that joins knows a master's address, a bootstrap token and the CA's hash
(``sha256:`` of the CA certificate's DER SubjectPublicKeyInfo, as kubeadm's
``--discovery-token-ca-cert-hash``). It reads ``/cluster-info`` once without checking
the server, keeps the CA only if its hash is the one it was given (``check_ca_hash``),
then reads it again over TLS checked against that CA, and only then trusts the masters'
list. Nothing here is secret: the CA certificate is public by nature, and the masters'
addresses are the ``default/kubernetes`` endpoints every pod can read.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from podnet.api.handlers import json_response
from podnet.api.registry import Registry
from podnet.model import errors
from podnet.model.kinds import ENDPOINTS

PATH = "/cluster-info"
KIND = "ClusterInfo"
API_VERSION = "podnet.io/v1"
HASH_PREFIX = "sha256:"


def ca_cert_hash(ca_pem: bytes) -> str:
    """``sha256:<hex>`` of the CA certificate's SubjectPublicKeyInfo (kubeadm's pin)."""
    cert = x509.load_pem_x509_certificate(ca_pem)
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return HASH_PREFIX + hashlib.sha256(spki).hexdigest()


def check_ca_hash(ca_pem: bytes, expected: str) -> None:
    """Raise ValueError unless ``ca_pem`` is one CA certificate whose pin is ``expected``."""
    if not expected.startswith(HASH_PREFIX) or len(expected) != len(HASH_PREFIX) + 64:
        raise ValueError(f"a CA hash is sha256:<64 hex digits>, not {expected!r}")
    try:
        found = ca_cert_hash(ca_pem)
    except ValueError as exc:
        raise ValueError(f"the server's CA certificate does not parse: {exc}") from exc
    if not hmac.compare_digest(found, expected.lower()):
        raise ValueError(
            f"the server's CA has hash {found}, not {expected}: refusing to trust it "
            "(a wrong --ca-cert-hash, or someone between this host and the master)"
        )


def document(ca_pem: bytes, servers: list[str]) -> dict[str, Any]:
    return {
        "kind": KIND,
        "apiVersion": API_VERSION,
        "certificateAuthorityData": base64.b64encode(ca_pem).decode(),
        "servers": servers,
    }


def parse(body: Any) -> tuple[bytes, list[str]]:
    """(CA PEM, masters' URLs) of a ``/cluster-info`` answer; ValueError if malformed."""
    if not isinstance(body, dict) or body.get("kind") != KIND:
        raise ValueError("not a ClusterInfo answer")
    try:
        ca = base64.b64decode(str(body["certificateAuthorityData"]), validate=True)
    except (KeyError, ValueError) as exc:
        raise ValueError("ClusterInfo without a valid certificateAuthorityData") from exc
    servers = body.get("servers")
    if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
        raise ValueError("ClusterInfo servers is not a list of URLs")
    return ca, [s for s in servers if s.startswith("https://")]


def master_urls(endpoints: dict[str, Any] | None) -> list[str]:
    """``https://IP:PORT`` of every address of the ``default/kubernetes`` endpoints."""
    urls: list[str] = []
    for subset in (endpoints or {}).get("subsets") or []:
        ports = [p.get("port") for p in subset.get("ports") or [] if p.get("name") == "https"]
        port = ports[0] if ports else 6443
        for address in subset.get("addresses") or []:
            if address.get("ip"):
                urls.append(f"https://{address['ip']}:{port}")
    return sorted(set(urls))


class ClusterInfo:
    """The ``/cluster-info`` handler of one master."""

    def __init__(self, ca_pem: bytes, registry: Registry) -> None:
        self.ca_pem = ca_pem
        self.registry = registry

    async def handle(self, request: web.Request) -> web.Response:
        try:
            endpoints = await self.registry.get(ENDPOINTS, "default", "kubernetes")
        except errors.ApiError as exc:
            if exc.code != 404:
                raise
            endpoints = None
        return json_response(document(self.ca_pem, master_urls(endpoints)))
