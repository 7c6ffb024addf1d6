"""A joining host's discovery of the cluster (kubeadm's token discovery, with the CA pin):
from a master's address and the CA's hash to the CA certificate and the masters' list.

The first read of ``/cluster-info`` checks nothing but the pin: its CA is kept only if
its SubjectPublicKeyInfo hashes to ``--ca-cert-hash``. The second read goes over TLS
checked against that CA (the server must hold a certificate the CA signed for its
address), and only its answer's masters are used. A wrong pin, a server that changes its
CA between the reads, or a malformed answer is an error that names what was wrong.
"""

from __future__ import annotations

import ssl
from urllib.parse import urlsplit

import aiohttp

from podnet.api.clusterinfo import PATH, check_ca_hash, parse

TIMEOUT = 15.0


class DiscoveryError(Exception):
    """The cluster could not be discovered, or not trusted."""


def check_server(server: str) -> str:
    """``server`` if it is an ``https://host:port`` URL with nothing else."""
    parts = urlsplit(server)
    if parts.scheme != "https" or not parts.hostname or parts.path not in ("", "/"):
        raise DiscoveryError(f"--server wants https://HOST:PORT, not {server!r}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise DiscoveryError(f"--server wants https://HOST:PORT, not {server!r}")
    return f"https://{parts.netloc}"


async def _read(server: str, context: ssl.SSLContext) -> tuple[bytes, list[str]]:
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)
    connector = aiohttp.TCPConnector(ssl=context)
    try:
        async with (
            aiohttp.ClientSession(server, connector=connector, timeout=timeout) as session,
            session.get(PATH) as answer,
        ):
            if answer.status != 200:
                raise DiscoveryError(f"{server}{PATH} answered {answer.status}")
            body = await answer.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise DiscoveryError(f"cannot read {server}{PATH}: {exc}") from exc
    try:
        return parse(body)
    except ValueError as exc:
        raise DiscoveryError(f"{server}{PATH}: {exc}") from exc


async def discover(server: str, ca_hash: str) -> tuple[bytes, list[str]]:
    """(CA PEM, masters' URLs) of the cluster ``server`` belongs to, trusted by the pin
    ``ca_hash``; the masters' list falls back to ``server`` when the cluster names none."""
    server = check_server(server)
    # Nothing is trusted from this read but the pin: no CA store either (loading the
    # system's costs ~20 ms of CPU, which 100 nodes joining in one process pay in turn).
    unchecked = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    unchecked.check_hostname = False
    unchecked.verify_mode = ssl.CERT_NONE
    ca, _ = await _read(server, unchecked)
    try:
        check_ca_hash(ca, ca_hash)
    except ValueError as exc:
        raise DiscoveryError(str(exc)) from exc
    checked = ssl.create_default_context(cadata=ca.decode("ascii", "replace"))
    again, servers = await _read(server, checked)
    if again != ca:
        raise DiscoveryError(f"{server} changed its CA between two reads: refusing it")
    return ca, servers or [server]


async def read_control_plane_certs(server: str, ca: bytes, token: str) -> bytes:
    """The sealed control-plane record (``podnet.api.controlplanecerts``) that ``server``
    keeps, read over TLS checked against ``ca`` with the bootstrap ``token``."""
    from podnet.api.controlplanecerts import PATH as CERTS_PATH
    from podnet.api.controlplanecerts import SealError, parse_document

    server = check_server(server)
    context = ssl.create_default_context(cadata=ca.decode("ascii", "replace"))
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with (
            aiohttp.ClientSession(
                server, connector=aiohttp.TCPConnector(ssl=context), timeout=timeout
            ) as session,
            session.get(CERTS_PATH, headers=headers) as answer,
        ):
            body = await answer.json(content_type=None)
            if answer.status != 200:
                why = body.get("message") if isinstance(body, dict) else None
                raise DiscoveryError(f"{server}{CERTS_PATH} answered {answer.status}: {why}")
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise DiscoveryError(f"cannot read {server}{CERTS_PATH}: {exc}") from exc
    try:
        return parse_document(body)
    except SealError as exc:
        raise DiscoveryError(f"{server}{CERTS_PATH}: {exc}") from exc
