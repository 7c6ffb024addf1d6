"""``podnet cluster up|down|status``: a local cluster on this machine."""

from __future__ import annotations

from pathlib import Path

import click

from podnet.cli.master_cmd import PLUGIN_ALIASES
from podnet.cluster.controlplane import DEFAULT_STATE_DIR, ControlPlane, ours

STATE_DIR = click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=DEFAULT_STATE_DIR,
    show_default=True,
    help="where the cluster keeps its processes' state, logs and kubeconfig",
)


@click.group("cluster")
def cluster() -> None:
    """Run a local virtual cluster."""


@cluster.command("up")
@STATE_DIR
@click.option(
    "--plugin", type=click.Choice(sorted(PLUGIN_ALIASES)), default="subnet", show_default=True
)
@click.option(
    "--cluster-network",
    "cluster_networks",
    multiple=True,
    help="CIDR:hostSubnetLength for the master (default 10.128.0.0/14:9)",
)
def up(state_dir: Path, plugin: str, cluster_networks: tuple[str, ...]) -> None:
    """Start etcd and the master (idempotent) and write the admin kubeconfig."""
    args: list[str] = []
    for value in cluster_networks:
        args += ["--cluster-network", value]
    plane = ControlPlane(state_dir)
    try:
        plane.up(plugin, args, say=lambda line: click.echo(f"  {line}"))
    except Exception as exc:
        raise click.ClickException(f"cluster up failed: {exc}") from exc
    click.echo(f"kubeconfig: {plane.kubeconfig}")
    click.echo(f"  export KUBECONFIG={plane.kubeconfig}")
    click.echo("tear down with: podnet cluster down")


@cluster.command("down")
@STATE_DIR
def down(state_dir: Path) -> None:
    """Stop everything `cluster up` started, and remove its state."""
    ControlPlane(state_dir).down(say=lambda line: click.echo(f"  {line}"))


@cluster.command("status")
@STATE_DIR
def status(state_dir: Path) -> None:
    """Show the control plane's processes, the nodes and their subnets."""
    plane = ControlPlane(state_dir)
    state = plane.state()
    if state is None:
        raise click.ClickException(f"no cluster at {state_dir}; run `podnet cluster up`")
    etcd_ok = ours(state.etcd_pid, "etcd")
    master_ok = ours(state.master_pid, "podnet")
    click.echo(f"plugin:  {PLUGIN_ALIASES.get(state.plugin, state.plugin)}")
    click.echo(
        f"etcd:    {'running' if etcd_ok else 'DOWN'} "
        f"(pid {state.etcd_pid}, port {state.etcd_port})"
    )
    click.echo(
        f"master:  {'running' if master_ok else 'DOWN'} (pid {state.master_pid}, "
        f"https://127.0.0.1:{state.master_port})"
    )
    if not master_ok:
        return
    from podnet.client import ApiClient
    from podnet.kubeconfig import load_client_config
    from podnet.model.kinds import HOST_SUBNET, NODE

    api = ApiClient(load_client_config(str(plane.kubeconfig)))
    subnets = {h["host"]: h for h in api.list(HOST_SUBNET)["items"]}
    click.echo("nodes:")
    for node in api.list(NODE)["items"]:
        name = node["metadata"]["name"]
        hs = subnets.get(name, {})
        click.echo(f"  {name:<20} {hs.get('hostIP', '-'):<16} {hs.get('subnet', '<no subnet>')}")
