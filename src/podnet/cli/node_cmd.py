"""``podnet node``: run the node agent until SIGTERM/SIGINT (the data plane stays up)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from podnet.agent import config as defaults
from podnet.cli.options import choice_option, log_options, log_to_stderr
from podnet.dataplane import registry
from podnet.dataplane.interface import TUNNELS
from podnet.dns import ratelimit
from podnet.dns.podrecords import POD_RECORD_MODES

if TYPE_CHECKING:
    from podnet.agent.config import AgentConfig
    from podnet.dataplane.interface import Tunnel

PathOption = click.Path(path_type=Path)


def _node_ip(value: str | None) -> ipaddress.IPv4Address | None:
    if not value:
        return None
    try:
        return ipaddress.IPv4Address(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not an IPv4 address") from exc


def _client_limits(
    qps: float, uncached_qps: float, tcp_connections: int, forwards: int
) -> ratelimit.ClientLimits:
    try:
        return ratelimit.ClientLimits(qps, uncached_qps, tcp_connections, forwards)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


DNS_OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--dns/--no-dns", {"default": True, "help": "Serve the cluster DNS to this node's pods"}),
    (
        "--dns-upstream-resolv-conf",
        {
            "type": PathOption,
            "default": defaults.DEFAULT_UPSTREAM_RESOLV_CONF,
            "help": "Where the DNS finds resolvers for names outside the cluster zone",
        },
    ),
    (
        "--dns-pod-records",
        {
            "type": click.Choice(POD_RECORD_MODES),
            "default": "verified",
            "help": "a-b-c-d.<ns>.pod names: for existing pods (watches Pods), any, none",
        },
    ),
    (
        "--dns-client-qps",
        {
            "type": click.FloatRange(min=1, max=1e9),
            "default": ratelimit.DEFAULT_QPS,
            "help": "DNS queries/s one pod may make (a token bucket holding 2 s of it); "
            "UDP queries beyond it are dropped, TCP ones wait",
        },
    ),
    (
        "--dns-client-uncached-qps",
        {
            "type": click.FloatRange(min=1, max=1e9),
            "default": ratelimit.DEFAULT_UNCACHED_QPS,
            "help": "Of those, queries/s the answer cache cannot answer (new or forwarded "
            "names: the costly ones); at most --dns-client-qps",
        },
    ),
    (
        "--dns-client-tcp-connections",
        {
            "type": click.IntRange(min=1),
            "default": ratelimit.DEFAULT_TCP_CONNECTIONS,
            "help": "DNS TCP connections one pod may hold open",
        },
    ),
    (
        "--dns-client-forwards",
        {
            "type": click.IntRange(min=1),
            "default": ratelimit.DEFAULT_FORWARDS,
            "help": "DNS queries of one pod that may wait on the upstream resolvers "
            "(more are answered REFUSED)",
        },
    ),
)


def dns_options(command: Callable[..., None]) -> Callable[..., None]:
    """The cluster DNS flags (it serves on the pod-subnet gateway IP, port 53)."""
    for flag, settings in reversed(DNS_OPTIONS):
        command = click.option(flag, show_default=True, **settings)(command)
    return command


@click.command("node")
@click.option("--node-name", default=defaults.default_node_name, show_default="host name")
@click.option(
    "--node-ip",
    default=None,
    help="This node's IPv4 address [default: of the default-route interface]",
)
@choice_option(
    "--tunnel",
    TUNNELS,
    "vxlan",
    "How pod traffic reaches other nodes (every node of a cluster uses the same)",
)
@click.option(
    "--cni-bin-dir", type=PathOption, default=defaults.DEFAULT_CNI_BIN_DIR, show_default=True
)
@click.option(
    "--cni-conf-dir", type=PathOption, default=defaults.DEFAULT_CNI_CONF_DIR, show_default=True
)
@click.option(
    "--socket",
    "socket_path",
    type=PathOption,
    default=defaults.DEFAULT_SOCKET_PATH,
    show_default=True,
    help="The CNI server's unix socket",
)
@click.option("--state-dir", type=PathOption, default=defaults.DEFAULT_STATE_DIR, show_default=True)
@click.option(
    "--ipam-dir",
    type=PathOption,
    default=defaults.DEFAULT_IPAM_DIR,
    show_default=True,
    help="host-local IPAM data dir",
)
@click.option(
    "--network-name",
    default=defaults.DEFAULT_NETWORK_NAME,
    show_default=True,
    help="CNI network name (conflist and IPAM directory)",
)
@click.option(
    "--pod-namespace",
    default="default",
    show_default=True,
    help="Namespace of pods whose runtime sends no K8S_POD_NAMESPACE",
)
@click.option(
    "--resync-period",
    type=click.FloatRange(min=0.1),
    default=defaults.DEFAULT_RESYNC_PERIOD,
    show_default=True,
    help="seconds",
)
@click.option(
    "--metrics-address",
    default=None,
    help="Serve Prometheus /metrics on HOST:PORT (e.g. 127.0.0.1:9101); off by default",
)
@dns_options
@choice_option(
    "--dataplane",
    registry.names(),
    "linux",
    "Data plane implementation, from podnet.dataplane.registry (fake: tests only)",
)
@log_options
@click.pass_context
def node(
    ctx: click.Context,
    node_name: str,
    node_ip: str | None,
    tunnel: str,
    cni_bin_dir: Path,
    cni_conf_dir: Path,
    socket_path: Path,
    state_dir: Path,
    ipam_dir: Path,
    network_name: str,
    pod_namespace: str,
    resync_period: float,
    metrics_address: str | None,
    dns: bool,
    dns_upstream_resolv_conf: Path,
    dns_pod_records: str,
    dns_client_qps: float,
    dns_client_uncached_qps: float,
    dns_client_tcp_connections: int,
    dns_client_forwards: int,
    dataplane: str,
) -> None:
    """Run the podnet node agent: register the node, set up its network, serve CNI.

    The node's credentials come from the global --kubeconfig (written by
    ``podnet node-credentials``), else $KUBECONFIG, else ~/.kube/config.
    """
    kubeconfig = getattr(ctx.find_root().obj, "kubeconfig", None)
    config = defaults.AgentConfig(
        node_name=node_name,
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
        node_ip=_node_ip(node_ip),
        tunnel=cast("Tunnel", tunnel),
        cni_bin_dir=cni_bin_dir,
        cni_conf_dir=cni_conf_dir,
        socket_path=socket_path,
        state_dir=state_dir,
        ipam_dir=ipam_dir,
        network_name=network_name,
        pod_namespace=pod_namespace,
        resync_period=resync_period,
        metrics_address=metrics_address,
        dns=dns,
        dns_upstream_resolv_conf=dns_upstream_resolv_conf,
        dns_pod_records=dns_pod_records,
        dns_client_limits=_client_limits(
            dns_client_qps, dns_client_uncached_qps, dns_client_tcp_connections, dns_client_forwards
        ),
        dns_device=registry.implementation(dataplane).gateway_device,
    )
    log_to_stderr()
    asyncio.run(_run(config, dataplane))


async def _run(config: AgentConfig, dataplane_kind: str) -> None:
    from podnet.agent.agent import NodeAgent
    from podnet.agent.certrotation import start_rotation
    from podnet.client.aio import AsyncApiClient
    from podnet.kubeconfig import load_client_config

    path = str(config.kubeconfig) if config.kubeconfig else None
    client = AsyncApiClient(load_client_config(path))
    node_ip = await config.resolved_node_ip()
    how = "given by --node-ip" if config.node_ip is not None else "detected"
    logging.getLogger("podnet.agent").info("node IP %s (%s)", node_ip, how)
    options = registry.DataPlaneOptions(state_dir=config.state_dir)
    dataplane = await registry.create(dataplane_kind, options)
    agent = NodeAgent(config, dataplane, client, node_ip)
    # a client certificate is renewed before it expires, and used without a restart
    rotation = start_rotation(client, agent.metrics.registry.register)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await agent.run(stop)
    except Exception as exc:
        logging.getLogger("podnet.agent").error("node agent failed: %s", exc)
        raise click.ClickException(str(exc)) from exc
    finally:
        if rotation is not None:
            rotation.cancel()
            await asyncio.gather(rotation, return_exceptions=True)
