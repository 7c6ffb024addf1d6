"""``podnet adm join master``: a host becomes a further master with its own etcd member,
as ``kubeadm join --control-plane --certificate-key`` does.

With a master's address, a bootstrap token (not bound to a node), the CA's hash and the
key ``podnet adm certs upload`` printed, the host discovers the cluster (the CA trusted
by its pin only), reads the sealed control-plane certificates and opens them
(``podnet.api.controlplanecerts``; the API CA in them must be the one the pin trusts),
then writes the CA pairs, issues its own serving, etcd member, peer and client
certificates, adds its etcd member to the cluster, writes ``etcd.env`` (state
``existing``) and ``master.env`` (the cluster's settings from the upload, every etcd
member), installs ``podnet-etcd`` and ``podnet-master`` and starts them. Nothing is
written before the certificates are open and checked.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hmac
import os
import socket
from pathlib import Path

import click

from podnet import deploy
from podnet.cli.adm_init import (
    ETCD_PKI,
    MASTER_STATE,
    UNITS,
    checked_address,
    give_member_files_to_etcd,
)
from podnet.cli.adm_join import BOOTSTRAP_TOKEN, join
from podnet.cli.main import CliError
from podnet.files import write_atomic

# bundle name -> file name under the etcd PKI directory
ETCD_CA_FILES = {
    "etcd-ca.crt": "ca.crt",
    "etcd-ca.key": "ca.key",
    "etcd-peer-ca.crt": "peer-ca.crt",
    "etcd-peer-ca.key": "peer-ca.key",
}


def _write_pair(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    for name, text in files.items():
        write_atomic(directory / name, text, 0o600 if name.endswith(".key") else 0o644)


def _endpoints(text: str, own: str) -> list[str]:
    found = [e.strip() for e in text.split(",") if e.strip()]
    return [*found, own] if own not in found else found


@join.command("master")
@click.option("--server", required=True, help="a master, https://HOST:PORT")
@click.option(
    "--token",
    envvar="PODNET_JOIN_TOKEN",
    required=True,
    help="bootstrap token ID.SECRET made without --node; or $PODNET_JOIN_TOKEN",
)
@click.option("--ca-cert-hash", required=True, help="sha256:<hex> of the cluster CA's public key")
@click.option(
    "--certificate-key",
    envvar="PODNET_CERTIFICATE_KEY",
    required=True,
    help="the key `podnet adm certs upload` printed; or $PODNET_CERTIFICATE_KEY",
)
@click.option("--advertise-address", required=True, help="this master's address (IPv4)")
@click.option("--name", default=None, help="the etcd member's name (default: the host name)")
def join_master(
    server: str,
    token: str,
    ca_cert_hash: str,
    certificate_key: str,
    advertise_address: str,
    name: str | None,
) -> None:
    """Make this host a further master of the cluster SERVER belongs to."""
    from podnet.api.clusterinfo import ca_cert_hash as hash_of
    from podnet.api.controlplanecerts import SealError, open_sealed, parse_key
    from podnet.api.pki import PkiError, ensure_pki
    from podnet.client.discovery import DiscoveryError, discover, read_control_plane_certs
    from podnet.store.etcd_client import parse_endpoints
    from podnet.store.etcd_members import MembershipError, add_member
    from podnet.store.etcd_pki import ensure_etcd_pki

    config_dir, units_dir, state_dir = deploy.CONFIG_DIR, deploy.UNITS_DIR, MASTER_STATE
    ip = checked_address(advertise_address)
    member = (name or socket.gethostname()).lower()
    if not BOOTSTRAP_TOKEN.fullmatch(token):
        raise CliError("--token wants a bootstrap token ID.SECRET ([a-z0-9]{6}.[a-z0-9]{16})")
    try:
        parse_key(certificate_key)
    except SealError as exc:
        raise CliError(str(exc)) from exc
    if (config_dir / "master.env").exists():
        raise CliError(f"{config_dir / 'master.env'} exists: this host is a master already")
    try:
        ca, _ = asyncio.run(discover(server, ca_cert_hash))
        click.echo(f"cluster CA trusted ({ca_cert_hash})")
        record = asyncio.run(read_control_plane_certs(server, ca, token))
        bundle = open_sealed(record, certificate_key, dt.datetime.now(dt.UTC))
    except (DiscoveryError, SealError) as exc:
        raise CliError(str(exc)) from exc
    if not hmac.compare_digest(hash_of(bundle["ca.crt"].encode()), hash_of(ca)):
        raise CliError("the uploaded CA is not the CA the hash trusts: refusing it")
    click.echo("control-plane certificates opened")
    try:
        etcd_endpoints = parse_endpoints(bundle["ETCD_ENDPOINTS"])
        _write_pair(state_dir / "pki", {"ca.crt": bundle["ca.crt"], "ca.key": bundle["ca.key"]})
        ensure_pki(state_dir / "pki", [ip])
        click.echo(f"API CA and serving certificate in {state_dir / 'pki'}")
        etcd_dir = config_dir / ETCD_PKI
        _write_pair(etcd_dir, {file: bundle[name] for name, file in ETCD_CA_FILES.items()})
        etcd_pki = ensure_etcd_pki(etcd_dir, {member: [ip]})
        cluster = asyncio.run(
            add_member(etcd_endpoints, etcd_pki.client_tls(), member, f"https://{ip}:2380")
        )
    except (PkiError, MembershipError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    give_member_files_to_etcd(etcd_pki.directory, member)
    click.echo(f"etcd member {member} at {ip} added: {cluster}")
    deploy.write_env(
        config_dir / "etcd.env",
        {
            "ETCD_NAME": member,
            "ETCD_IP": ip,
            "ETCD_CLUSTER": cluster,
            "ETCD_CLUSTER_STATE": "existing",
        },
    )
    endpoints = _endpoints(bundle["ETCD_ENDPOINTS"], f"{ip}:2379")
    settings = {k: bundle[k] for k in ("CLUSTER_NETWORK", "SERVICE_NETWORK", "NETWORK_PLUGIN")}
    deploy.write_env(
        config_dir / "master.env",
        {
            "MASTER_IP": ip,
            "ETCD_ENDPOINTS": ",".join(endpoints),
            **settings,
            "MASTER_EXTRA_ARGS": "",
        },
    )
    click.echo(f"wrote {config_dir / 'etcd.env'} and {config_dir / 'master.env'}")
    for unit in UNITS:
        click.echo(f"installed {deploy.install_unit(unit, units_dir)}")
    click.echo(deploy.start(UNITS))
    click.echo(f"master {member} joined; its API is https://{ip}:6443")
