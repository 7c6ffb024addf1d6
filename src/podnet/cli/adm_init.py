"""``podnet adm init``: the first master host, as ``kubeadm init`` makes a control plane.

On this host it makes the etcd PKI (one member, this host, and the master's client
certificate; the member's files owned by the ``etcd`` user that runs etcd), the API's CA
and serving certificate, ``/etc/podnet/etcd.env`` and ``master.env``, installs the
``podnet-etcd`` and ``podnet-master`` units as shipped, and starts them (systemctl, when
systemd runs the host). It prints the CA's hash, which nodes join with. A host that has
``/etc/podnet/master.env`` already is refused with nothing changed.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
from pathlib import Path

import click

from podnet import deploy
from podnet.cli.adm import adm
from podnet.cli.main import CliError, CliState, pass_state

ETCD_PKI = "etcd-pki"
MASTER_STATE = Path("/var/lib/podnet/master")
UNITS = ("podnet-etcd.service", "podnet-master.service")
ETCD_USER = "etcd"  # Debian's etcd-server makes it; podnet-etcd.service runs as it


@adm.command("init")
@click.option("--advertise-address", required=True, help="this master's address (IPv4)")
@click.option(
    "--cluster-network",
    default="10.128.0.0/14:9",
    show_default=True,
    help="CIDR:HOSTBITS of pod addresses, every node a subnet of it",
)
@click.option("--service-network", default="172.30.0.0/16", show_default=True)
@click.option(
    "--network-plugin",
    default="networkpolicy",
    show_default=True,
    type=click.Choice(["subnet", "multitenant", "networkpolicy"]),
)
@click.option("--name", default=None, help="the etcd member's name (default: the host name)")
@pass_state
def init(
    state: CliState,
    advertise_address: str,
    cluster_network: str,
    service_network: str,
    network_plugin: str,
    name: str | None,
) -> None:
    """Make this host the first master: etcd, the master, their PKI and units."""
    from podnet.api.clusterinfo import ca_cert_hash
    from podnet.api.pki import ensure_pki
    from podnet.store.etcd_pki import PkiError, ensure_etcd_pki

    config_dir, units_dir, state_dir = deploy.CONFIG_DIR, deploy.UNITS_DIR, MASTER_STATE
    ip = checked_address(advertise_address)
    member = (name or socket.gethostname()).lower()
    _check_networks(cluster_network, service_network)
    if (config_dir / "master.env").exists():
        raise CliError(f"{config_dir / 'master.env'} exists: this host is a master already")
    try:
        etcd_pki = ensure_etcd_pki(config_dir / ETCD_PKI, {member: [ip]})
    except PkiError as exc:
        raise CliError(str(exc)) from exc
    give_member_files_to_etcd(etcd_pki.directory, member)
    click.echo(f"etcd PKI in {etcd_pki.directory} (member {member} at {ip})")
    pki = ensure_pki(state_dir / "pki", [ip])
    click.echo(f"API CA and serving certificate in {state_dir / 'pki'}")
    deploy.write_env(
        config_dir / "etcd.env",
        {
            "ETCD_NAME": member,
            "ETCD_IP": ip,
            "ETCD_CLUSTER": f"{member}=https://{ip}:2380",
            "ETCD_CLUSTER_STATE": "new",
        },
    )
    deploy.write_env(
        config_dir / "master.env",
        {
            "MASTER_IP": ip,
            "ETCD_ENDPOINTS": f"{ip}:2379",
            "CLUSTER_NETWORK": cluster_network,
            "SERVICE_NETWORK": service_network,
            "NETWORK_PLUGIN": network_plugin,
            "MASTER_EXTRA_ARGS": "",  # more `podnet master` flags, split at spaces
        },
    )
    click.echo(f"wrote {config_dir / 'etcd.env'} and {config_dir / 'master.env'}")
    for unit in UNITS:
        click.echo(f"installed {deploy.install_unit(unit, units_dir)}")
    click.echo(deploy.start(UNITS))
    ca_hash = ca_cert_hash(pki.ca_pem())
    click.echo(f"CA hash: {ca_hash}")
    click.echo(
        "nodes join with: podnet adm join node "
        f"--server https://{ip}:6443 --token <bootstrap token> --ca-cert-hash {ca_hash}"
    )
    click.echo(
        "masters join with: podnet adm join master "
        f"--server https://{ip}:6443 --token <bootstrap token> --ca-cert-hash {ca_hash} "
        "--certificate-key <key of podnet adm certs upload> --advertise-address <their IP>"
    )


def checked_address(value: str) -> str:
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError as exc:
        raise CliError(f"--advertise-address wants an IPv4 address, not {value!r}") from exc
    if address.is_unspecified or address.is_loopback or address.is_multicast:
        raise CliError(f"--advertise-address {value} is not an address other hosts can reach")
    return str(address)


def _check_networks(cluster_network: str, service_network: str) -> None:
    from podnet.model.network import parse_cluster_network_flag

    try:
        parse_cluster_network_flag(cluster_network)
        ipaddress.IPv4Network(service_network)
    except ValueError as exc:
        raise CliError(str(exc)) from exc


def give_member_files_to_etcd(directory: Path, member: str) -> None:
    """The member's and peer's keys and certificates, the CAs and the directory go to the
    ``etcd`` user (etcd reads them); the master's client pair stays root's."""
    try:
        user = pwd.getpwnam(ETCD_USER)
    except KeyError as exc:
        raise CliError(f"no user {ETCD_USER!r}: install Debian's etcd-server first") from exc
    names = [f"{kind}-{member}.{ext}" for kind in ("member", "peer") for ext in ("crt", "key")]
    for path in [directory, *(directory / n for n in (*names, "ca.crt", "peer-ca.crt"))]:
        os.chown(path, user.pw_uid, user.pw_gid)
