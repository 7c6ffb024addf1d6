"""``podnet cluster up|down|status|matrix``: a local virtual cluster on this machine.

The cluster is etcd and the master as loopback processes, an underlay namespace with a
bridge, N node namespaces each running a real ``podnet node``, and pods wired by the real
CNI plugin (``podnet pod run``). Everything lives in namespaces named ``pn-<id>-...``
and is recorded in ``<state dir>/state.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from podnet.cli.master_cmd import PLUGIN_ALIASES
from podnet.cli.options import choice_option
from podnet.cluster.controlplane import DEFAULT_STATE_DIR, ControlPlane
from podnet.cluster.state import CLUSTER_DATAPLANES, ClusterState
from podnet.dataplane.interface import TUNNELS

STATE_DIR = click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=DEFAULT_STATE_DIR,
    show_default=True,
    envvar="PODNET_STATE_DIR",
    help="where the cluster keeps its processes' state, logs and kubeconfig",
)


def say(line: str) -> None:
    """Progress output, indented under the command's own lines."""
    click.echo(f"  {line}")


@click.group("cluster")
def cluster() -> None:
    """Run a local virtual cluster."""


@cluster.command("up")
@STATE_DIR
@click.option("--nodes", "node_count", type=click.IntRange(0, 200), default=3, show_default=True)
@choice_option("--tunnel", TUNNELS, "vxlan", "How pod traffic crosses between nodes")
@click.option(
    "--plugin", type=click.Choice(sorted(PLUGIN_ALIASES)), default="subnet", show_default=True
)
@choice_option(
    "--dataplane",
    CLUSTER_DATAPLANES,
    "linux",
    "The agents' data plane: Linux bridge + nftables, or Open vSwitch (OpenFlow)",
)
@click.option(
    "--cluster-network",
    "cluster_networks",
    multiple=True,
    help="CIDR:hostSubnetLength for the master (default 10.128.0.0/14:9)",
)
@click.option(
    "--service-node-port-range",
    default=None,
    help="the masters' node port range, A-B [default: 30000-32767]",
)
@click.option(
    "--external-ip-cidrs",
    default=None,
    help="CIDRs Services' externalIPs may come from, comma-separated [default: none]",
)
@click.option(
    "--dns-upstream",
    "dns_upstreams",
    multiple=True,
    help="a resolver the nodes' DNS forwards names outside cluster.local to (up to 3) "
    "[default: as recorded, or the host's /etc/resolv.conf nameservers]",
)
@click.option(
    "--etcd-members",
    type=click.IntRange(1, 7),
    default=None,
    help="etcd cluster size (TLS, static loopback ports) [default: as recorded, or 1]",
)
@click.option(
    "--masters",
    type=click.IntRange(1, 5),
    default=None,
    help="masters with leader election [default: as recorded, or 1]",
)
@click.option(
    "--router",
    is_flag=True,
    help="run the HAProxy router (pod default/router on node1, ports 80/443 of node1's "
    "underlay address; *.apps.podnet.test resolves to it from the external host); "
    "kept once started",
)
def up(
    state_dir: Path,
    node_count: int,
    tunnel: str,
    plugin: str,
    dataplane: str,
    cluster_networks: tuple[str, ...],
    service_node_port_range: str | None,
    external_ip_cidrs: str | None,
    dns_upstreams: tuple[str, ...],
    etcd_members: int | None,
    masters: int | None,
    router: bool,
) -> None:
    """Start (or complete) the cluster: control plane, underlay and N nodes. Idempotent:
    a dead etcd member or master is restarted with its recorded ports and data."""
    from podnet.cluster.lifecycle import ClusterError, ClusterSpec, cluster_up

    args: list[str] = []
    for value in cluster_networks:
        args += ["--cluster-network", value]
    if service_node_port_range is not None:
        args += ["--service-node-port-range", service_node_port_range]
    if external_ip_cidrs is not None:
        args += ["--external-ip-cidrs", external_ip_cidrs]
    spec = ClusterSpec(
        node_count,
        tunnel,
        plugin,
        tuple(args),
        etcd_members=etcd_members or 0,
        masters=masters or 0,
        dns_upstreams=dns_upstreams or None,
        dataplane=dataplane,
        router=router,
    )
    try:
        cluster_up(state_dir, spec, say=say)
    except ClusterError as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:
        raise click.ClickException(f"cluster up failed: {exc}") from exc
    kubeconfig = ControlPlane(state_dir).kubeconfig
    click.echo(f"kubeconfig: {kubeconfig}")
    click.echo(f"  export KUBECONFIG={kubeconfig}")
    click.echo(f"tear down with: podnet cluster down{_state_flag(state_dir)}")


def _state_flag(state_dir: Path) -> str:
    return "" if state_dir == DEFAULT_STATE_DIR else f" --state-dir {state_dir}"


@cluster.command("down")
@STATE_DIR
def down(state_dir: Path) -> None:
    """Stop everything `cluster up` started, remove its namespaces and its state."""
    from podnet.cluster.lifecycle import cluster_down

    cluster_down(state_dir, say=say)


@cluster.command("status")
@STATE_DIR
def status(state_dir: Path) -> None:
    """Show what is really up: etcd members, masters and the leader, the nodes with their
    subnets, agent and Ready condition, the pods. Exit code 1 when anything is down."""
    state = ClusterState.load(state_dir)
    if state is None:
        raise click.ClickException(f"no cluster at {state_dir}; run `podnet cluster up`")
    healthy = _show_control_plane(state, state_dir)
    if healthy is None:
        click.get_current_context().exit(1)
    nodes_ok = _show_nodes(state, state_dir)
    _show_pods(state)
    router_ok = _show_router(state)
    if not (healthy and nodes_ok and router_ok):
        click.get_current_context().exit(1)


def _mark(ok: bool, good: str = "ok", bad: str = "DOWN") -> str:
    return good if ok else bad


def _show_control_plane(state: ClusterState, state_dir: Path) -> bool | None:
    """Print the control plane; True if all is up, False if degraded, None if no API."""
    from podnet.cluster.health import control_plane_health

    report = control_plane_health(state, ControlPlane(state_dir))
    click.echo(
        f"cluster: {state.cluster_id or '-'} ({state.tunnel} tunnel, {state.dataplane} data plane)"
    )
    click.echo(f"plugin:  {PLUGIN_ALIASES.get(state.plugin, state.plugin)}")
    click.echo("etcd (TLS, client certificates):")
    for m in report.members:
        click.echo(
            f"  {m.name:<8} pid {m.pid:<8} https://127.0.0.1:{m.client_port:<6} "
            f"process {_mark(m.alive, 'alive', 'DEAD')}, "
            f"health {_mark(m.healthy, 'ok', 'FAILING')}"
        )
    click.echo(f"masters (leader: {report.leader or 'NONE'}):")
    for master in report.masters:
        role = "leader" if master.leader else "standby"
        click.echo(
            f"  master{master.index:<2} pid {master.pid:<8} https://127.0.0.1:{master.port:<6} "
            f"process {_mark(master.alive, 'alive', 'DEAD')}, "
            f"healthz {_mark(master.serving, 'ok', 'FAILING')}, "
            f"readyz {_mark(master.ready, 'ok', 'no')}, {role}"
        )
    if report.api_relay is not None:
        click.echo(
            f"api relay: https://127.0.0.1:{state.api_port} "
            f"{_mark(report.api_relay, 'running', 'DOWN')}"
        )
    verdict = "healthy" if report.ok else "DEGRADED"
    click.echo(f"control plane: {verdict}")
    if not any(master.serving for master in report.masters):
        click.echo("no master answers: node state from the API is unavailable")
        return None
    return report.ok


def _show_nodes(state: ClusterState, state_dir: Path) -> bool:
    from podnet.cluster.health import reconcile_report
    from podnet.cluster.lifecycle import node_health
    from podnet.cluster.nodes import metrics_location
    from podnet.cluster.ovsstatus import node_dataplane_status
    from podnet.cluster.pods import admin_api

    with admin_api(state_dir) as api:
        report = node_health(state, state_dir, api)
        problems = reconcile_report(api, [node.name for node in report])
    click.echo("nodes:")
    header = f"  {'NAME':<8} {'NETNS':<20} {'NODE IP':<16} {'SUBNET':<18} {'AGENT':<12} HEALTH"
    click.echo(header)
    planes_ok = True
    for node in report:
        agent = f"pid {node.agent_pid}" if node.agent_alive else "DOWN"
        checks = [
            "process " + ("ok" if node.agent_alive else "dead"),
            "socket " + ("ok" if node.socket_ok else "silent"),
            "Ready " + {True: "yes", False: "NO", None: "?"}[node.ready],
        ]
        verdict = "healthy" if node.healthy else "UNHEALTHY"
        click.echo(
            f"  {node.name:<8} {node.netns:<20} {node.ip:<16} {node.subnet or '<none>':<18} "
            f"{agent:<12} {verdict} ({', '.join(checks)})"
        )
        plane = node_dataplane_status(state_dir, state.dataplane, node.name)
        click.echo(f"    data plane: {plane.text()}")
        record = state.nodes.get(node.name)
        metrics = metrics_location(record) if record is not None else None
        if metrics is not None:
            click.echo(f"    metrics: {metrics}")
        planes_ok = planes_ok and plane.healthy
        for problem in problems.get(node.name, []):
            click.echo(f"    RECONCILE {problem}")
    return planes_ok and all(node.healthy for node in report)


def _show_pods(state: ClusterState) -> None:
    if not state.pods:
        click.echo("pods: none (podnet pod run NAME)")
        return
    click.echo("pods:")
    for pod in sorted(state.pods.values(), key=lambda p: (p.node, p.key)):
        running = "running" if pod.process and pod.process.alive() else "STOPPED"
        click.echo(f"  {pod.key:<24} {pod.node:<8} {pod.ip or '-':<16} {running}")


def _show_router(state: ClusterState) -> bool:
    """Print the router's line (none: nothing); False when a part of it is down."""
    if state.router is None:
        return True
    from podnet.cluster.routerprocs import router_health

    health = router_health(state)
    click.echo(f"router: {health.text()}")
    return health.ok


@cluster.command("matrix")
@STATE_DIR
@click.option(
    "-n", "--namespace", "namespaces", multiple=True, help="only pods of these namespaces"
)
def matrix(state_dir: Path, namespaces: tuple[str, ...]) -> None:
    """Ping and TCP-echo from every pod to every other pod; print the matrix."""
    from podnet.cluster.lifecycle import endpoints
    from podnet.cluster.matrix import render_matrix, run_matrix

    state = ClusterState.load(state_dir)
    if state is None:
        raise click.ClickException(f"no cluster at {state_dir}; run `podnet cluster up`")
    pods = endpoints(state, namespaces)
    if len(pods) < 2:
        raise click.ClickException("the matrix needs at least two pods (podnet pod run NAME)")
    results = run_matrix(pods)
    click.echo(render_matrix(pods, results))
    reached = _services_by_name(state_dir, pods, namespaces or tuple(state_namespaces(state)))
    if not all(r.ok for r in [*results, *reached]):
        click.get_current_context().exit(1)


def state_namespaces(state: ClusterState) -> list[str]:
    return sorted({pod.namespace for pod in state.pods.values()})


def _services_by_name(state_dir: Path, pods: list[Any], namespaces: tuple[str, ...]) -> list[Any]:
    """Reach the pods' namespaces' Services by name from every node; print the lines."""
    from podnet.cluster.matrix import probe_services, render_services, service_targets
    from podnet.cluster.pods import admin_api
    from podnet.model.kinds import SERVICE

    with admin_api(state_dir) as api:
        found = [item for ns in namespaces for item in api.list(SERVICE, ns)["items"]]
    targets = service_targets(found)
    if not targets:
        return []
    reached = probe_services(pods, targets)
    click.echo("")
    click.echo(render_services(reached))
    return reached
