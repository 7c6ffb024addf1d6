"""Bring a whole local cluster up, report on it, and take it down.

``cluster_up`` is idempotent: the control plane, the underlay, the external host and
each node are "ensured", so a second run with the cluster up changes nothing, and a run
with more nodes adds the missing ones. ``cluster_down`` removes exactly what the state
records (processes by PID, namespaces by name), also after a crash, and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network, ip_address
from pathlib import Path
from typing import Any

from podnet import netns
from podnet.cluster.appsdns import DEFAULT_DOMAIN as APPS_DOMAIN
from podnet.cluster.controlplane import ControlPlane, ControlPlaneError
from podnet.cluster.masteraccess import ensure_master_relays
from podnet.cluster.matrix import Endpoint
from podnet.cluster.nodes import (
    ensure_node,
    host_subnet,
    node_paths,
    node_ready,
    socket_answers,
)
from podnet.cluster.ovsnodes import check_ovs_paths, release_strays, stop_ovs
from podnet.cluster.podresolv import remove_resolv_conf
from podnet.cluster.pods import admin_api
from podnet.cluster.router import ensure_router, stop_router
from podnet.cluster.state import CLUSTER_DATAPLANES, ClusterState, locked, new_cluster_id
from podnet.cluster.underlay import DEFAULT_UNDERLAY, ensure_external_host, ensure_underlay
from podnet.dataplane.interface import TUNNELS, NodeSetupRefused
from podnet.dns.upstreams import MAX_NAMESERVERS, nameservers

HOST_RESOLV_CONF = Path("/etc/resolv.conf")

Say = Callable[[str], None]


class ClusterError(Exception):
    """The cluster cannot do what was asked (the message says why)."""


@dataclass(frozen=True)
class ClusterSpec:
    """What ``cluster up`` was asked for."""

    nodes: int = 3
    tunnel: str = "vxlan"
    plugin: str = "subnet"
    master_args: tuple[str, ...] = ()
    underlay_cidr: str = DEFAULT_UNDERLAY
    etcd_members: int = 0  # 0: as recorded, or 1
    masters: int = 0  # 0: as recorded, or 1
    dns_upstreams: tuple[str, ...] | None = None  # None: as recorded (none: the host's)
    dataplane: str = "linux"  # a registry name: linux or ovs
    router: bool = False  # run the router (kept once recorded, also without the flag)


def _initial_state(state_dir: Path, spec: ClusterSpec) -> ClusterState:
    state = ClusterState.load(state_dir)
    if state is None or not state.cluster_id:
        _check_paths(state_dir, spec)
        state = state or ClusterState(plugin=spec.plugin)
        state.cluster_id = new_cluster_id()
        state.tunnel, state.underlay_cidr = spec.tunnel, spec.underlay_cidr
        state.dataplane = spec.dataplane
        state.save(state_dir)
        return state
    if state.tunnel != spec.tunnel:
        raise ClusterError(
            f"the cluster runs the {state.tunnel} tunnel; `podnet cluster down` first "
            f"to use {spec.tunnel}"
        )
    if state.dataplane != spec.dataplane:
        raise ClusterError(
            f"the cluster runs the {state.dataplane} data plane; `podnet cluster down` "
            f"first to use {spec.dataplane}"
        )
    _check_paths(state_dir, spec)
    if state.plugin != spec.plugin and ControlPlane(state_dir).running():
        raise ClusterError(
            f"the cluster runs the {state.plugin} plugin; `podnet cluster down` first "
            f"to use {spec.plugin}"
        )
    return state


def _check_paths(state_dir: Path, spec: ClusterSpec) -> None:
    """ovs: every node's OVS sockets must fit a unix socket path (before anything starts)."""
    if spec.dataplane == "ovs":
        try:
            check_ovs_paths(state_dir, max(spec.nodes, 1))
        except NodeSetupRefused as exc:
            raise ClusterError(str(exc)) from exc


def cluster_up(state_dir: Path, spec: ClusterSpec, say: Say = print) -> ClusterState:
    """Ensure the control plane, the underlay, the external host and ``spec.nodes`` nodes."""
    if spec.tunnel not in TUNNELS:
        raise ClusterError(f"unknown tunnel {spec.tunnel!r} (one of {', '.join(TUNNELS)})")
    if spec.dataplane not in CLUSTER_DATAPLANES:
        known = ", ".join(CLUSTER_DATAPLANES)
        raise ClusterError(f"unknown data plane {spec.dataplane!r} (one of {known})")
    IPv4Network(spec.underlay_cidr)  # a bad CIDR fails here, before anything starts
    upstreams = checked_upstreams(spec.dns_upstreams)
    with locked(state_dir):
        state = _initial_state(state_dir, spec)
        if upstreams is not None:
            state.dns_upstreams = upstreams
            state.save(state_dir)
        say(
            f"cluster {state.cluster_id}: {spec.tunnel} tunnel, {spec.dataplane} data plane, "
            f"state in {state_dir}"
        )
        try:
            ControlPlane(state_dir).up(
                spec.plugin, master_args(spec), say, spec.etcd_members, spec.masters
            )
        except ControlPlaneError as exc:
            raise ClusterError(str(exc)) from exc
        state = ClusterState.load(state_dir) or state  # the control plane recorded its PIDs
        ensure_underlay(state, state_dir)
        host = ensure_external_host(state, state_dir)
        say(f"underlay {state.underlay_cidr} in {state.prefix()}-underlay; external host {host.ip}")
        relayed = ensure_master_relays(state, state_dir)
        say(f"masters on the underlay (default/kubernetes): {', '.join(relayed) or 'none'}")
        if len(state.nodes) > spec.nodes:
            say(f"the cluster has {len(state.nodes)} nodes; `cluster up` never removes nodes")
        write_upstream_resolv_confs(state, state_dir, max(spec.nodes, len(state.nodes)))
        release_strays(state, state_dir, say)
        with admin_api(state_dir) as api:
            for index in range(1, spec.nodes + 1):
                ensure_node(state, state_dir, index, api, say)
        if spec.router or state.router is not None:
            ensure_router(state, state_dir, say)
        return state


def master_args(spec: ClusterSpec) -> list[str]:
    """The masters' arguments: those asked for, and Routes without a host named under
    the apps domain, which resolves to the router from the external host."""
    args = list(spec.master_args)
    if "--route-suffix" not in args:
        args += ["--route-suffix", APPS_DOMAIN]
    return args


def checked_upstreams(given: Sequence[str] | None) -> list[str] | None:
    """The DNS upstream addresses asked for (None: keep what is recorded), or ClusterError."""
    if given is None:
        return None
    if len(given) > MAX_NAMESERVERS:
        raise ClusterError(f"at most {MAX_NAMESERVERS} DNS upstreams, got {len(given)}")
    try:
        return [str(ip_address(value)) for value in given]
    except ValueError as exc:
        raise ClusterError(f"bad DNS upstream: {exc}") from exc


def upstream_resolv_conf(state: ClusterState) -> str:
    """What each node's DNS forwards names outside the cluster zone to: the recorded
    upstreams, or else the host's nameservers."""
    found = state.dns_upstreams
    if not found:
        try:
            found = nameservers(HOST_RESOLV_CONF.read_text())
        except OSError:
            found = []
    return "".join(f"nameserver {address}\n" for address in found)


def write_upstream_resolv_confs(state: ClusterState, state_dir: Path, count: int) -> None:
    """Each node's upstream resolv.conf (its agent rereads it when it changes)."""
    text = upstream_resolv_conf(state)
    for index in range(1, count + 1):
        path = node_paths(state_dir, f"node{index}").upstream_resolv_conf
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not path.exists() or path.read_text() != text:
            temporary = path.with_suffix(".tmp")
            temporary.write_text(text)
            temporary.replace(path)


def stop_processes(state: ClusterState, say: Say) -> None:
    """Stop the router, every recorded pod process, agent, relay and the external echo
    server."""
    stop_router(state, say)
    for pod in state.pods.values():
        if pod.prober and pod.prober.stop(timeout=5):
            say(f"pod {pod.key} prober stopped (pid {pod.prober.pid})")
        if pod.process and pod.process.stop(timeout=5):
            say(f"pod {pod.key} process stopped (pid {pod.process.pid})")
    for node in state.nodes.values():
        if node.agent and node.agent.stop():
            say(f"{node.name} agent stopped (pid {node.agent.pid})")
        if node.relay and node.relay.stop(timeout=5):
            say(f"{node.name} API relay stopped (pid {node.relay.pid})")
        if node.podwatch and node.podwatch.stop(timeout=5):
            say(f"{node.name} pod exit watcher stopped (pid {node.podwatch.pid})")
    for master in state.masters:
        if master.relay and master.relay.stop(timeout=5):
            say(f"master {master.index} underlay relay stopped (pid {master.relay.pid})")
    if state.external and state.external.echo and state.external.echo.stop(timeout=5):
        say(f"external echo server stopped (pid {state.external.echo.pid})")


def remove_namespaces(state: ClusterState, say: Say) -> None:
    """Remove every recorded namespace, by exact name, newest first."""
    guard = f"{state.prefix()}-"
    for name in reversed(state.namespaces):
        if not state.cluster_id or not name.startswith(guard):
            say(f"warning: not removing {name!r}: it lacks this cluster's prefix {guard}")
            continue
        if netns.remove(name):
            say(f"removed namespace {name}")
        if remove_resolv_conf(name):
            say(f"removed /etc/netns/{name}")


def cluster_down(state_dir: Path, say: Say = print) -> None:
    """Remove everything the state records, then the control plane and the state dir."""
    if not (state_dir / "state.json").exists():
        say(f"no cluster state at {state_dir}; nothing to do")
        return
    with locked(state_dir):
        state = ClusterState.load(state_dir)
        if state is not None:
            stop_processes(state, say)
            stop_ovs(state, state_dir, say)  # the agents leave their OVS daemons running
            remove_namespaces(state, say)
        ControlPlane(state_dir).down(say=say)


@dataclass(frozen=True)
class NodeHealth:
    """What ``cluster status`` shows for a node."""

    name: str
    netns: str
    ip: str
    subnet: str | None
    agent_pid: int
    agent_alive: bool
    socket_ok: bool
    ready: bool | None

    @property
    def healthy(self) -> bool:
        return self.agent_alive and self.socket_ok and self.ready is not False


def node_health(state: ClusterState, state_dir: Path, api: Any) -> list[NodeHealth]:
    """Agent process, CNI socket and Node Ready of every recorded node."""
    report = []
    for node in sorted(state.nodes.values(), key=lambda n: n.index):
        alive = bool(node.agent and node.agent.alive())
        report.append(
            NodeHealth(
                name=node.name,
                netns=node.netns,
                ip=node.ip,
                subnet=host_subnet(api, node.name),
                agent_pid=node.agent.pid if node.agent else 0,
                agent_alive=alive,
                socket_ok=alive and socket_answers(node_paths(state_dir, node.name).socket),
                ready=node_ready(api, node.name),
            )
        )
    return report


def endpoints(state: ClusterState, namespaces: Sequence[str] = ()) -> list[Endpoint]:
    """The recorded pods (of ``namespaces``, or all) as matrix endpoints, by node then
    name; not the router, which serves no echo."""
    router = state.router.pod if state.router else None
    pods = [
        p
        for p in state.pods.values()
        if p.ip and (not namespaces or p.namespace in namespaces) and p.key != router
    ]
    pods.sort(key=lambda p: (state.nodes[p.node].index if p.node in state.nodes else 0, p.key))
    one_namespace = len({p.namespace for p in pods}) <= 1
    return [Endpoint(p.name if one_namespace else p.key, p.node, p.ip, p.netns) for p in pods]
