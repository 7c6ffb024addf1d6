"""``podnet master``: run the API server and controllers until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import click

from podnet.api.registry import DEFAULT_PREFIX
from podnet.api.routehosts import DEFAULT_ROUTE_SUFFIX
from podnet.cli.audit_options import audit_options
from podnet.cli.etcd_options import etcd_endpoints_text, etcd_tls
from podnet.cli.options import log_options, log_to_stderr
from podnet.cli.serving_options import limit_options, listen_address
from podnet.cli.signing_options import CLUSTER_SIGNING_DURATION

if TYPE_CHECKING:
    import datetime as dt

    from podnet.api.audit import AuditOptions
    from podnet.api.limits import RequestLimits
    from podnet.api.servicealloc import ServiceRanges
    from podnet.controllers.config import NetworkConfig
    from podnet.listener import ConnectionLimits

PLUGIN_ALIASES = {
    "subnet": "redhat/openshift-ovs-subnet",
    "multitenant": "redhat/openshift-ovs-multitenant",
    "networkpolicy": "redhat/openshift-ovs-networkpolicy",
}


NODE_PORTS_HELP = "node ports of NodePort/LoadBalancer Services  [default: 30000-32767]"
ADVERTISE_HELP = (
    "the address at which nodes and pods reach this master: the endpoints of the "
    "default/kubernetes Service (default: none, the Service has no endpoints)"
)
EXTERNAL_IPS_HELP = "CIDRs a Service's externalIPs may come from, comma-separated (default: none)"


def _plugin(value: str) -> str:
    return PLUGIN_ALIASES.get(value, value)


def network_options(command: Callable[..., None]) -> Callable[..., None]:
    """The ClusterNetwork flags (``podnet master``, ``podnet controllers``), passed to the
    command as one ``network: NetworkConfig``."""
    flags = [
        click.option(
            "--cluster-network",
            "cluster_networks",
            multiple=True,
            default=["10.128.0.0/14:9"],
            show_default=True,
            help="CIDR:hostSubnetLength, repeatable, tried in order",
        ),
        click.option("--service-network", default="172.30.0.0/16", show_default=True),
        click.option(
            "--network-plugin",
            default="subnet",
            show_default=True,
            help="subnet | multitenant | networkpolicy (or the full redhat/openshift-ovs-* name)",
        ),
        click.option("--mtu", default=1450, show_default=True, type=int),
        click.option("--vxlan-port", default=4789, show_default=True, type=int),
    ]

    @functools.wraps(command)
    def with_network(
        *args: Any,
        cluster_networks: tuple[str, ...],
        service_network: str,
        network_plugin: str,
        mtu: int,
        vxlan_port: int,
        **kwargs: Any,
    ) -> None:
        network = _network(cluster_networks, service_network, network_plugin, mtu, vxlan_port)
        command(*args, network=network, **kwargs)

    for flag in reversed(flags):
        with_network = flag(with_network)
    return with_network


def _network(
    cluster_networks: tuple[str, ...],
    service_network: str,
    network_plugin: str,
    mtu: int,
    vxlan_port: int,
) -> NetworkConfig:
    from podnet.controllers.config import NetworkConfig, parse_cluster_network_flag

    try:
        return NetworkConfig(
            cluster_networks=[parse_cluster_network_flag(v) for v in cluster_networks],
            service_network=ipaddress.IPv4Network(service_network),
            plugin_name=_plugin(network_plugin),
            vxlan_port=vxlan_port,
            mtu=mtu,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@click.command("master")
@click.option(
    "--etcd",
    "etcd_endpoints",
    multiple=True,
    default=["127.0.0.1:2379"],
    show_default=True,
    help="etcd endpoint host:port; repeat it or separate with commas for several members",
)
@click.option("--etcd-cafile", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--etcd-certfile", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--etcd-keyfile", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--kubeconfig-server",
    default="",
    help="server URL for the admin kubeconfig (e.g. a relay in front of several masters)",
)
@click.option(
    "--etcd-prefix", default=DEFAULT_PREFIX, show_default=True, help="key prefix for all objects"
)
@click.option(
    "--listen", default="127.0.0.1:6443", show_default=True, help="address:port to serve HTTPS on"
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=Path("/var/lib/podnet/master"),
    show_default=True,
    help="PKI, the admin kubeconfig and etcd.json (where tokens are: see adm token) live here",
)
@network_options
@click.option(
    "--host", "extra_hosts", multiple=True, help="extra name/IP for the server certificate"
)
@click.option(
    "--compact-interval",
    default=300.0,
    show_default=True,
    type=float,
    help="seconds of etcd history to keep before compacting",
)
@click.option("--service-node-port-range", default="30000-32767", help=NODE_PORTS_HELP)
@click.option("--external-ip-cidrs", default="", help=EXTERNAL_IPS_HELP)
@click.option("--leader-elect/--no-leader-elect", default=True, show_default=True)
@click.option("--advertise-address", default="", help=ADVERTISE_HELP)
@click.option(
    "--route-suffix",
    default=DEFAULT_ROUTE_SUFFIX,
    show_default=True,
    help="Routes without a host get <name>-<namespace>.<suffix>",
)
@click.option(
    "--advertise-port",
    default=0,
    type=click.IntRange(0, 65535),
    help="the port at --advertise-address  [default: --listen's]",
)
@click.option(
    "--controllers/--no-controllers",
    "run_controllers",
    default=True,
    show_default=True,
    help="run the controllers in this process (--no-controllers: `podnet controllers` does)",
)
@click.option(
    "--gc-freeze-every",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0.0),
    help="seconds between freezes of the long-lived heap, which keep the garbage "
    "collector's pauses short (0: CPython's collector as it is)",
)
@click.option(
    "--gc-thaw-every",
    default=1800.0,
    show_default=True,
    type=click.FloatRange(0.0, min_open=True),
    help="seconds between full collections of the whole heap, frozen part included",
)
@CLUSTER_SIGNING_DURATION
@limit_options
@audit_options
@log_options
def master(
    etcd_endpoints: tuple[str, ...],
    etcd_cafile: Path | None,
    etcd_certfile: Path | None,
    etcd_keyfile: Path | None,
    kubeconfig_server: str,
    etcd_prefix: str,
    listen: str,
    state_dir: Path,
    network: NetworkConfig,
    extra_hosts: tuple[str, ...],
    compact_interval: float,
    service_node_port_range: str,
    external_ip_cidrs: str,
    leader_elect: bool,
    advertise_address: str,
    route_suffix: str,
    advertise_port: int,
    run_controllers: bool,
    gc_freeze_every: float,
    gc_thaw_every: float,
    cluster_signing_duration: dt.timedelta,
    request_limits: RequestLimits,
    connection_limits: ConnectionLimits,
    audit: AuditOptions,
) -> None:
    """Run the podnet master: the API server on etcd, and its controllers."""
    from podnet.master import Master, MasterOptions

    host, port = listen_address(listen)
    services = _service_ranges(network, service_node_port_range, external_ip_cidrs)
    options = MasterOptions(
        network=network,
        etcd=etcd_endpoints_text(etcd_endpoints),
        etcd_tls=etcd_tls(etcd_cafile, etcd_certfile, etcd_keyfile),
        kubeconfig_server=kubeconfig_server,
        etcd_prefix=etcd_prefix,
        listen_host=host,
        listen_port=port,
        state_dir=state_dir,
        extra_hosts=list(extra_hosts),
        compact_interval=compact_interval,
        leader_elect=leader_elect,
        run_controllers=run_controllers,
        services=services,
        advertise_address=_advertise_address(advertise_address),
        advertise_port=advertise_port,
        route_suffix=_route_suffix(route_suffix),
        heap=_heap_schedule(gc_freeze_every, gc_thaw_every),
        cluster_signing_duration=cluster_signing_duration,
        request_limits=request_limits,
        connection_limits=connection_limits,
        audit=audit,
    )
    log_to_stderr()
    asyncio.run(run_until_signalled(Master(options), "podnet.master"))


def _heap_schedule(freeze_every: float, thaw_every: float) -> tuple[float, float] | None:
    if not freeze_every:
        return None
    if thaw_every < freeze_every:
        raise click.BadParameter(
            f"{thaw_every} is shorter than --gc-freeze-every {freeze_every}",
            param_hint="--gc-thaw-every",
        )
    return freeze_every, thaw_every


def _route_suffix(value: str) -> str:
    from podnet.api.routehosts import suffix_problem

    problem = suffix_problem(value)
    if problem:
        raise click.BadParameter(f"{value!r}: {problem}", param_hint="--route-suffix")
    return value


def _advertise_address(value: str) -> str:
    """An address the kubernetes Service's endpoints may hold ('' : none)."""
    from podnet.model.schemas_endpoints import special_ip_problem

    if not value:
        return ""
    try:
        address = str(ipaddress.ip_address(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--advertise-address") from exc
    problem = special_ip_problem(address)
    if problem:
        raise click.BadParameter(f"{address} {problem}", param_hint="--advertise-address")
    return address


def _service_ranges(network: NetworkConfig, node_ports: str, external_cidrs: str) -> ServiceRanges:
    """The Service settings of ``podnet master``'s flags; a bad value names its flag."""
    from podnet.api.servicealloc import PortRange, ServiceRanges, parse_cidrs

    try:
        ports = PortRange.parse(node_ports)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--service-node-port-range") from exc
    try:
        cidrs = parse_cidrs(external_cidrs)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--external-ip-cidrs") from exc
    return ServiceRanges(network.service_network, ports, cidrs)


class Service(Protocol):
    """A long-running process body: ``podnet master``, ``podnet controllers``."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def run_until_signalled(service: Service, logger: str) -> None:
    """Start ``service``, run until SIGTERM or SIGINT, then stop it."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await service.start()
    except Exception as exc:
        await service.stop()
        raise click.ClickException(str(exc)) from exc
    await stop.wait()
    logging.getLogger(logger).info("stopping")
    await service.stop()


def serve(make: Callable[[], Service], logger: str) -> None:
    """Build a process body (its bad options, ``OSError``/``ValueError``, become one
    error line), log to stderr and run it until SIGTERM or SIGINT."""
    try:
        process = make()
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    log_to_stderr()
    asyncio.run(run_until_signalled(process, logger))


# The master's state dir: the credentials commands read its CA and etcd.json (tokens' etcd).
STATE_DIR_OPTION = click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=Path("/var/lib/podnet/master"),
    show_default=True,
)


@click.command("node-credentials")
@click.argument("node")
@STATE_DIR_OPTION
@click.option(
    "--server", required=True, help="API URL the node should use, e.g. https://10.0.0.1:6443"
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    required=True,
    help="where to write the node's kubeconfig",
)
def node_credentials(node: str, state_dir: Path, server: str, output: Path) -> None:
    """Issue a token for NODE (in etcd) and write a kubeconfig that can act only as it."""
    from podnet.master import node_credentials as issue

    path = issue(state_dir, node, server, output)
    click.echo(f"kubeconfig for node {node} written to {path}")


@click.command("controllers-credentials")
@click.argument("name")
@STATE_DIR_OPTION
@click.option("--token-file", type=click.Path(path_type=Path), required=True, help="written 0600")
@click.option("--ca-file", type=click.Path(path_type=Path), required=True, help="the API's CA")
def controllers_credentials(name: str, state_dir: Path, token_file: Path, ca_file: Path) -> None:
    """Issue a token for the controllers instance NAME (group system:podnet:controllers: only
    what the controllers use) for ``podnet controllers --token-file --certificate-authority``."""
    from podnet.master import controllers_credentials as issue

    issue(state_dir, name, token_file, ca_file)
    click.echo(f"token for controllers {name} written to {token_file}, the CA to {ca_file}")
