"""``podnet adm join node``: a host becomes a node, as ``kubeadm join`` makes a worker.

With a master's address, a bootstrap token and the CA's hash, the host discovers the
cluster (``podnet.client.discovery``: the CA, trusted only by its pin, and the masters),
gets its node client certificate through a CertificateSigningRequest
(``podnet.client.bootstrap``; the token is never written to disk), writes its kubeconfig
naming the local API relay, the relay's list of masters, and the relay and node units,
then starts them (systemctl, when systemd runs the host). Nothing is written before the
CA is trusted; a refused request leaves only the node's key (kept for a retry).
"""

from __future__ import annotations

import asyncio
import re
from urllib.parse import urlsplit

import click

from podnet import deploy
from podnet.agent.config import default_node_name
from podnet.cli.adm import adm
from podnet.cli.main import CliError, CliState, pass_state
from podnet.model.schemas_names import dns_subdomain_problem

BOOTSTRAP_TOKEN = re.compile(r"[a-z0-9]{6}\.[a-z0-9]{16}")
RELAY = "https://127.0.0.1:6443"  # the node's kubeconfig names its local relay
NODE_UNITS = ("podnet-api-relay.service", "podnet-node.service")


@adm.group("join")
def join() -> None:
    """Join this host to a cluster."""


@join.command("node")
@click.option("--server", required=True, help="a master, https://HOST:PORT")
@click.option(
    "--token",
    envvar="PODNET_JOIN_TOKEN",
    required=True,
    help="bootstrap token ID.SECRET (podnet adm token create); or $PODNET_JOIN_TOKEN",
)
@click.option("--ca-cert-hash", required=True, help="sha256:<hex> of the cluster CA's public key")
@click.option(
    "--timeout",
    type=click.FloatRange(1, 3600),
    default=300.0,
    show_default=True,
    help="seconds to wait for the certificate",
)
@pass_state
def join_node(
    state: CliState,
    server: str,
    token: str,
    ca_cert_hash: str,
    timeout: float,
) -> None:
    """Make this host a node of the cluster SERVER belongs to."""
    from podnet.client.bootstrap import BootstrapError, bootstrap_node
    from podnet.client.discovery import DiscoveryError, check_server, discover
    from podnet.kubeconfig import ClientConfig

    # The name podnet-node.service's agent registers with (it takes no --node-name), so
    # the certificate is for the node that will use it.
    name = default_node_name()
    config_dir, units_dir = deploy.CONFIG_DIR, deploy.UNITS_DIR
    why = dns_subdomain_problem(name)
    if why:
        raise CliError(f"node name {name!r} {why}")
    if not BOOTSTRAP_TOKEN.fullmatch(token):
        raise CliError("--token wants a bootstrap token ID.SECRET ([a-z0-9]{6}.[a-z0-9]{16})")
    kubeconfig = config_dir / "node.kubeconfig"
    if kubeconfig.exists():
        raise CliError(f"{kubeconfig} exists: this host has joined already (nothing changed)")
    try:
        ca, masters = asyncio.run(discover(server, ca_cert_hash))
        click.echo(f"cluster CA trusted ({ca_cert_hash}); masters: {' '.join(masters)}")
        bootstrap = ClientConfig(check_server(server), ca, token)
        key = config_dir / "node.key"
        config_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        asyncio.run(bootstrap_node(bootstrap, name, key, kubeconfig, timeout, server=RELAY))
    except (DiscoveryError, BootstrapError) as exc:
        raise CliError(str(exc)) from exc
    click.echo(f"node {name}: client certificate issued; {kubeconfig} (0600) names {RELAY}")
    targets = " ".join(f"--target {_host_port(url)}" for url in masters)
    env = deploy.write_env(config_dir / "relay.env", {"RELAY_TARGETS": targets})
    click.echo(f"{env}: the relay's masters ({targets})")
    for unit in NODE_UNITS:
        click.echo(f"installed {deploy.install_unit(unit, units_dir)}")
    click.echo(deploy.start(NODE_UNITS))


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 443}"
