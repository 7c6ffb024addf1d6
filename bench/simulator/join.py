"""A simulated node's join (issue 20): bootstrap token -> discovery -> CSR -> mTLS.

What ``podnet adm join node`` does, through the same code: ``podnet.client.discovery``
reads the master's public ``/cluster-info`` and keeps its CA only if it matches the CA
hash; ``podnet.client.bootstrap.bootstrap_node`` makes the node's key, sends the
CertificateSigningRequest with the node's own bootstrap token (bound to its name) and
waits until the master's approver and signer issue the certificate, and writes the
node's kubeconfig (client certificate and key, no token). The agent then talks to the
master with that kubeconfig's TLS context (``podnet.client.tls.ssl_context``): mutual
TLS, no bearer token.
"""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit

from podnet.client.bootstrap import bootstrap_node
from podnet.client.discovery import check_server, discover
from podnet.client.tls import ssl_context
from podnet.kubeconfig import ClientConfig, load_client_config
from simulator.wire import Endpoint

CERT_TIMEOUT = 300.0  # seconds the node waits for its certificate (adm join's default)


async def join_node(
    server: str, ca_hash: str, name: str, token: str, state_dir: Path, marks: dict[str, float]
) -> tuple[Path, Endpoint]:
    """Join node ``name`` with its bootstrap ``token``: its kubeconfig (in ``state_dir``,
    0600, with its key beside it) and the mTLS endpoint its agent uses. ``marks`` gets
    when discovery ended (``discovered``, ``time.monotonic``)."""
    ca, _ = await discover(server, ca_hash)
    marks["discovered"] = time.monotonic()
    bootstrap = ClientConfig(check_server(server), ca, token)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    kubeconfig = await bootstrap_node(
        bootstrap, name, state_dir / "node.key", state_dir / "node.kubeconfig", CERT_TIMEOUT
    )
    config = load_client_config(str(kubeconfig))
    if config.token or not config.client_cert_data:
        raise RuntimeError(f"{kubeconfig}: not a client-certificate kubeconfig")
    url = urlsplit(config.server)
    endpoint = Endpoint(url.hostname or "127.0.0.1", url.port or 443, ssl_context(config))
    return kubeconfig, endpoint
