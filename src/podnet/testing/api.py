"""An httpx client for a test master, built straight from its kubeconfig."""

from __future__ import annotations

import base64
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
import yaml

from podnet.api.identity import NODES_GROUP, node_user
from podnet.api.pki import ensure_pki
from podnet.api.registry import Registry
from podnet.api.server import ApiServer
from podnet.api.tokenauth import TokenAuthenticator
from podnet.api.tokenissue import issue
from podnet.client.aio import AsyncApiClient
from podnet.kubeconfig import ClientConfig
from podnet.store.memory import MemoryStore

ClientT = TypeVar("ClientT", bound=AsyncApiClient)


def kubeconfig_parts(path: Path) -> tuple[str, bytes, str]:
    """(server, CA PEM, token) of the first cluster and user in a kubeconfig."""
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    cluster = data["clusters"][0]["cluster"]
    token = data["users"][0]["user"]["token"]
    return cluster["server"], base64.b64decode(cluster["certificate-authority-data"]), token


def _ssl(ca_pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    return context


def client_for(kubeconfig: Path, token: str | None = "", timeout: float = 30.0) -> httpx.Client:
    """A sync client; ``token=None`` sends no Authorization header, ``""`` the kubeconfig's."""
    server, ca, default_token = kubeconfig_parts(kubeconfig)
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token or default_token}"
    return httpx.Client(base_url=server, verify=_ssl(ca), headers=headers, timeout=timeout)


def async_client_for(
    kubeconfig: Path,
    token: str | None = "",
    timeout: float = 30.0,
    limits: httpx.Limits | None = None,
) -> httpx.AsyncClient:
    server, ca, default_token = kubeconfig_parts(kubeconfig)
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token or default_token}"
    return httpx.AsyncClient(
        base_url=server,
        verify=_ssl(ca),
        headers=headers,
        timeout=timeout,
        limits=limits or httpx.Limits(max_connections=100),
    )


def node(name: str, ip: str, uid: str | None = None) -> dict[str, Any]:
    """A minimal v1 Node with an InternalIP."""
    meta: dict[str, Any] = {"name": name}
    if uid:
        meta["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": labels or {}},
    }


def pod(
    name: str,
    ns: str = "default",
    node_name: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": spec,
    }


def aiohttp_session_for(kubeconfig: Path, limit: int = 32) -> aiohttp.ClientSession:
    """An aiohttp session for load generation (much lighter per request than httpx)."""
    server, ca, token = kubeconfig_parts(kubeconfig)
    connector = aiohttp.TCPConnector(ssl=_ssl(ca), limit=limit)
    return aiohttp.ClientSession(
        base_url=server,
        headers={"Authorization": f"Bearer {token}"},
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
    )


@contextlib.asynccontextmanager
async def node_api_server(
    state_dir: Path, node_name: str
) -> AsyncIterator[tuple[Registry, ApiServer, ClientConfig]]:
    """A real API server (TLS, tokens, authorizer) over an in-memory store on 127.0.0.1,
    and the client configuration of ``node_name``'s own token; stopped on exit."""
    store = MemoryStore()
    registry = Registry(store, prefix="/t/")
    # the node's token, stored hashed, as a master stores every token (podnet.api.tokenauth)
    node_token = await issue(store, "/t/", node_user(node_name), [NODES_GROUP])
    tokens = TokenAuthenticator(store, "/t/")
    await tokens.start()
    pki = ensure_pki(state_dir / "pki", ["127.0.0.1"])
    server = ApiServer(registry, tokens)
    await server.start("127.0.0.1", 0, pki.server_ssl_context())
    try:
        yield registry, server, ClientConfig(server.address, pki.ca_pem(), node_token)
    finally:
        await server.stop()
        await tokens.stop()


@contextlib.asynccontextmanager
async def node_api_client(
    state_dir: Path, node_name: str, client_type: Callable[[ClientConfig], ClientT]
) -> AsyncIterator[tuple[Registry, ClientT]]:
    """``node_api_server``'s registry and a ``client_type`` client with the node's own
    token; the client is closed, then the server stopped, on exit."""
    async with node_api_server(state_dir, node_name) as (registry, _, config):
        client = client_type(config)
        try:
            yield registry, client
        finally:
            await client.close()


def bootstrap_token(state_dir: Path, node: str | None = None) -> str:
    """A new bootstrap token (``id.secret``) in the etcd of the master that ran in
    ``state_dir`` (its ``etcd.json``), bound to ``node`` if given: what ``podnet adm
    token create`` makes."""
    from podnet.api.tokenissue import create_bootstrap
    from podnet.api.tokenstore import StoreSettings, run

    settings = StoreSettings.require(state_dir)
    return run(settings, lambda store: create_bootstrap(store, settings.prefix, node=node))


def cert_client_for(kubeconfig: Path, keepalive: float = 5.0) -> httpx.Client:
    """A sync client authenticated by the client certificate of ``kubeconfig`` (what
    ``podnet adm join node`` writes), no bearer token; an idle connection is kept
    ``keepalive`` seconds."""
    import tempfile

    doc = yaml.safe_load(kubeconfig.read_text())
    cluster, user = doc["clusters"][0]["cluster"], doc["users"][0]["user"]
    context = _ssl(base64.b64decode(cluster["certificate-authority-data"]))
    with tempfile.TemporaryDirectory() as scratch:
        cert, key = Path(scratch) / "client.crt", Path(scratch) / "client.key"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        context.load_cert_chain(cert, key)
    limits = httpx.Limits(keepalive_expiry=keepalive)
    return httpx.Client(base_url=cluster["server"], verify=context, timeout=30.0, limits=limits)
