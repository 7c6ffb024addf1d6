"""``podnet adm backup`` and ``podnet adm restore``: etcd snapshots (``etcdctl``).

``backup`` reaches etcd the way ``podnet master`` does (``--etcd``, ``--etcd-cafile``,
``--etcd-certfile``, ``--etcd-keyfile``); without ``--etcd`` it backs up the local cluster
at ``--state-dir`` when there is one (its members and the masters' etcd client
certificate), else ``127.0.0.1:2379`` like the master's default. ``restore`` needs no
etcd: it makes a new data directory for one member (``podnet.store.etcd_snapshot``).
"""

from __future__ import annotations

from pathlib import Path

import click

from podnet.cli.adm import adm
from podnet.cli.cluster_cmd import STATE_DIR
from podnet.cli.etcd_options import etcd_endpoints, etcd_tls
from podnet.cli.main import CliError
from podnet.store.etcd_pki import EtcdTls
from podnet.store.etcd_snapshot import RestorePlan, SnapshotError, next_steps, restore, save

MASTER_DEFAULT_ETCD = "127.0.0.1:2379"
HOST_MASTER_STATE = Path("/var/lib/podnet/master")  # podnet-master.service's --state-dir
FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _given_endpoints(values: tuple[str, ...]) -> list[str]:
    return [_hostport(host, port) for host, port in etcd_endpoints(values)]


def etcd_target(
    state_dir: Path, endpoints: tuple[str, ...], tls: EtcdTls | None
) -> tuple[list[str], EtcdTls | None, str]:
    """(endpoints, TLS, where they came from): the flags, else the local cluster at
    ``state_dir``, else the etcd settings of this host's master (``adm init`` or ``join
    master`` made it; its ``etcd.json``), else the master's default endpoint."""
    if endpoints:
        return _given_endpoints(endpoints), tls, "--etcd"
    if tls is None and (state_dir / "state.json").is_file():
        from podnet.cluster.controlplane import ControlPlane

        plane = ControlPlane(state_dir)
        state = plane.state()
        if state is not None and state.etcd_members:
            found = plane.etcd_endpoints(state).split(",")
            return found, plane.etcd_tls(), f"the local cluster at {state_dir}"
    if tls is None:
        from podnet.api.tokenstore import NoStoreSettings, StoreSettings

        try:
            saved = StoreSettings.load(HOST_MASTER_STATE)
        except NoStoreSettings as exc:
            raise CliError(str(exc)) from exc
        if saved is not None:
            where = f"this host's master ({HOST_MASTER_STATE / 'etcd.json'})"
            return saved.endpoints.split(","), saved.tls, where
    return [MASTER_DEFAULT_ETCD], tls, "the master's default"


@adm.command("backup")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="the snapshot file to write (mode 0600: it holds every secret of the cluster)",
)
@click.option(
    "--etcd",
    "etcd_endpoints",
    multiple=True,
    help="etcd endpoint host:port, as for `podnet master` (default: the local cluster at "
    "--state-dir if there is one, else 127.0.0.1:2379)",
)
@click.option("--etcd-cafile", type=FILE)
@click.option("--etcd-certfile", type=FILE)
@click.option("--etcd-keyfile", type=FILE)
@STATE_DIR
def backup(
    output: Path,
    etcd_endpoints: tuple[str, ...],
    etcd_cafile: Path | None,
    etcd_certfile: Path | None,
    etcd_keyfile: Path | None,
    state_dir: Path,
) -> None:
    """Write an etcd snapshot of the whole cluster to OUTPUT: atomically, mode 0600, and
    checked with `etcdctl snapshot status` before it is reported."""
    tls = etcd_tls(etcd_cafile, etcd_certfile, etcd_keyfile)
    endpoints, tls, source = etcd_target(state_dir, etcd_endpoints, tls)
    try:
        found = save(endpoints, tls, output)
    except SnapshotError as exc:
        raise CliError(f"backup failed, {output} unchanged: {exc}") from exc
    click.echo(f"wrote {output} (mode 0600) from etcd at {','.join(endpoints)} ({source}):")
    click.echo(f"  {found.describe()}")
    click.echo("  it holds every secret of the cluster: keep it where only root can read it")


@adm.command("restore")
@click.argument("snapshot", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="the member's new data directory (must not exist, or be empty)",
)
@click.option("--name", required=True, help="the member's name (etcd --name)")
@click.option(
    "--initial-advertise-peer-urls",
    "peer_urls",
    required=True,
    help="the member's peer URL(s), comma-separated, e.g. https://10.0.0.11:2380",
)
@click.option(
    "--initial-cluster",
    default="",
    help="every member as name=peer-url, comma-separated (default: this member only)",
)
@click.option(
    "--initial-cluster-token",
    default="podnet",
    show_default=True,
    help="as the members run with (the podnet-etcd unit's is podnet)",
)
def restore_cmd(
    snapshot: Path,
    data_dir: Path,
    name: str,
    peer_urls: str,
    initial_cluster: str,
    initial_cluster_token: str,
) -> None:
    """Make a new etcd data directory for one member from SNAPSHOT (`etcdctl snapshot
    restore`); an existing non-empty directory is never touched."""
    urls = tuple(u.strip() for u in peer_urls.split(",") if u.strip())
    plan = RestorePlan(data_dir, name, urls, initial_cluster, initial_cluster_token)
    try:
        found = restore(snapshot, plan)
    except SnapshotError as exc:
        raise CliError(f"restore failed, nothing changed: {exc}") from exc
    click.echo(f"restored {snapshot} ({found.describe()}) into {data_dir} for member {name}")
    click.echo("next steps:")
    for number, step in enumerate(next_steps(plan), start=1):
        click.echo(f"  {number}. {step}")
