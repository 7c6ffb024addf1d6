"""Node namespaces and their agents.

Node ``k`` is the namespace ``pn-<id>-node<k>`` with one link onto the underlay
(address ``.10+k``), an API relay (see ``relay.py``) and a real ``podnet node`` agent
started inside it with nsenter, exactly as it would run on a host. Each node keeps its
files under ``<state dir>/nodes/<name>/``: kubeconfig, CNI bin and conf dirs, the CNI
socket, the agent's state and IPAM dirs, and logs. Agents and relays are recorded by PID
and stopped by PID only. Each agent serves its ``/metrics`` on 127.0.0.1 of its node
namespace (``AGENT_METRICS_PORT``): reachable from that namespace only, never from the
root namespace, the underlay or the pods.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podnet import netns
from podnet.cluster.state import ClusterState, NodeRecord, spawn
from podnet.cluster.underlay import (
    create_netns,
    external_address,
    node_address,
    plug,
    tcp_listens,
)

Say = Callable[[str], None]
AGENT_TIMEOUT = 90.0
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes
AGENT_METRICS_PORT = 9101  # on the node namespace's loopback only


@dataclass(frozen=True)
class NodePaths:
    """Where one node's files live."""

    root: Path

    @property
    def kubeconfig(self) -> Path:
        return self.root / "node.kubeconfig"

    @property
    def cni_bin_dir(self) -> Path:
        return self.root / "cni-bin"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni-conf"

    @property
    def socket(self) -> Path:
        return self.root / "cni.sock"

    @property
    def agent_dir(self) -> Path:
        return self.root / "agent"

    @property
    def ipam_dir(self) -> Path:
        return self.root / "ipam"

    @property
    def agent_log(self) -> Path:
        return self.root / "agent.log"

    @property
    def relay_log(self) -> Path:
        return self.root / "relay.log"

    @property
    def upstream_resolv_conf(self) -> Path:
        """The resolvers the node's DNS forwards names outside the cluster zone to."""
        return self.root / "upstream-resolv.conf"

    @property
    def shim(self) -> Path:
        return self.cni_bin_dir / "podnet"

    @property
    def conflist(self) -> Path:
        return self.cni_conf_dir / "10-podnet.conflist"


def node_paths(state_dir: Path, node: str) -> NodePaths:
    """The files of ``node`` in the cluster at ``state_dir``."""
    return NodePaths(state_dir / "nodes" / node)


def new_node_record(state: ClusterState, index: int) -> NodeRecord:
    """The names and address of node ``index`` (1-based)."""
    return NodeRecord(
        name=f"node{index}",
        index=index,
        netns=f"{state.prefix()}-node{index}",
        ip=str(node_address(state, index).ip),
        metrics_port=AGENT_METRICS_PORT,
    )


def metrics_location(node: NodeRecord) -> str | None:
    """Where the node's agent serves ``/metrics`` (None: not served), for people."""
    if not node.metrics_port:
        return None
    return f"http://127.0.0.1:{node.metrics_port}/metrics in netns {node.netns}"


def create_node_netns(state: ClusterState, state_dir: Path, node: NodeRecord) -> None:
    """The node namespace on the underlay, forwarding like a host that routes pods, with
    a default route to the external host as a host has one to its router (so traffic to
    a cluster IP without endpoints is routed, and then refused by the service proxy)."""
    create_netns(state, state_dir, node.netns)
    plug(state, node.netns, f"{state.prefix()}-n{node.index}", node_address(state, node.index))
    netns.run(node.netns, ["sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
    router = str(external_address(state).ip)
    netns.run(node.netns, ["ip", "route", "replace", "default", "via", router], check=True)


def agent_command(state: ClusterState, node: NodeRecord, paths: NodePaths) -> list[str]:
    """``podnet node`` for this node, wrapped to run inside its namespace."""
    argv = [
        sys.executable,
        "-m",
        "podnet",
        "node",
        "--kubeconfig",
        str(paths.kubeconfig),
        "--node-name",
        node.name,
        "--node-ip",
        node.ip,
        "--tunnel",
        state.tunnel,
        "--cni-bin-dir",
        str(paths.cni_bin_dir),
        "--cni-conf-dir",
        str(paths.cni_conf_dir),
        "--socket",
        str(paths.socket),
        "--state-dir",
        str(paths.agent_dir),
        "--ipam-dir",
        str(paths.ipam_dir),
        "--dataplane",
        state.dataplane,
        "--dns-upstream-resolv-conf",
        str(paths.upstream_resolv_conf),
    ]
    if node.metrics_port:  # the namespace's loopback: never an address others reach
        argv += ["--metrics-address", f"127.0.0.1:{node.metrics_port}"]
    return netns.command(node.netns, argv)


def agent_needle(paths: NodePaths) -> str:
    """The piece of the agent's command line that only this node's agent has."""
    return f"--state-dir {paths.agent_dir} "


def start_relay(state: ClusterState, node: NodeRecord, paths: NodePaths) -> None:
    """Start the API relay into the node namespace and wait until it listens."""
    port = str(state.master_port)
    argv = [sys.executable, "-m", "podnet.cluster.relay", "--netns", node.netns, "--port", port]
    for master in state.masters:  # several masters: the relay fails over between them
        argv += ["--target-port", str(master.port)]
    node.relay = spawn(argv, paths.relay_log, f"podnet.cluster.relay --netns {node.netns} ")
    deadline = time.monotonic() + 10
    while not tcp_listens(node.netns, state.master_port):
        if time.monotonic() > deadline or not node.relay.alive():
            raise RuntimeError(f"API relay for {node.name} did not start; see {paths.relay_log}")
        time.sleep(0.05)


def prepare_node_files(state: ClusterState, node: NodeRecord, state_dir: Path) -> NodePaths:
    """The node's directories and its kubeconfig (a node token, the master's address)."""
    from podnet.master import node_credentials

    paths = node_paths(state_dir, node.name)
    if len(str(paths.socket)) > MAX_SOCKET_PATH:
        raise ValueError(f"state dir too long for a unix socket path: {paths.socket}")
    for directory in (paths.cni_bin_dir, paths.cni_conf_dir, paths.agent_dir, paths.ipam_dir):
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    server = f"https://127.0.0.1:{state.master_port}"
    node_credentials(state_dir / "master", node.name, server, paths.kubeconfig)
    return paths


def start_agent(state: ClusterState, node: NodeRecord, state_dir: Path) -> None:
    """Start the node's agent inside its namespace (it must not be running), and record
    its PID in ``state`` (also when ``node`` is a record of another copy of the state:
    an agent whose PID is not saved could never be stopped by ``cluster down``)."""
    paths = node_paths(state_dir, node.name)
    command = agent_command(state, node, paths)
    # $KUBECONFIG too: `podnet` hoists a --kubeconfig given after the sub-command to the
    # global option, and the agent falls back to $KUBECONFIG.
    env = {"KUBECONFIG": str(paths.kubeconfig)}
    node.agent = spawn(command, paths.agent_log, agent_needle(paths), env=env)
    if node.name in state.nodes:
        state.nodes[node.name].agent = node.agent
    state.save(state_dir)


def stop_agent(node: NodeRecord, sig: int = signal.SIGTERM, timeout: float = 10.0) -> bool:
    """Stop the node's agent by its recorded PID (``sig`` first, SIGKILL after timeout)."""
    return node.agent.stop(timeout, sig) if node.agent else False


def socket_answers(path: Path, timeout: float = 2.0) -> bool:
    """Whether the agent answers a CNI STATUS request (as a runtime sends it) on its
    socket with success, i.e. it is ready for ADDs."""
    from podnet.cni import shim

    config = {"cniVersion": "1.1.0", "name": "podnet", "type": "podnet", "socketPath": str(path)}
    env = {"CNI_COMMAND": "STATUS", "CNI_PATH": str(path.parent / "cni-bin")}
    body = json.dumps({"env": env, "config": json.dumps(config)}).encode()
    try:
        status, _ = shim.post(str(path), body, timeout)
    except shim.AgentUnreachable:
        return False
    return 200 <= status < 300


def node_ready(api: Any, name: str) -> bool | None:
    """The Node's Ready condition: True/False, or None if the Node has none (or is gone)."""
    from podnet.client import StatusError
    from podnet.model.kinds import NODE

    try:
        node = api.get(NODE, None, name)
    except StatusError:
        return None
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return None


def host_subnet(api: Any, name: str) -> str | None:
    """The node's HostSubnet CIDR, if allocated."""
    from podnet.client import StatusError
    from podnet.model.kinds import HOST_SUBNET

    try:
        return str(api.get(HOST_SUBNET, None, name)["subnet"])
    except StatusError:
        return None


def wait_agent_ready(
    node: NodeRecord, state_dir: Path, api: Any, timeout: float = AGENT_TIMEOUT
) -> str:
    """Wait until the agent answers on its socket, its HostSubnet exists and its Node is
    Ready; return the subnet. Raise with the log's tail if the agent dies."""
    paths = node_paths(state_dir, node.name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.agent is None or not node.agent.alive():
            raise RuntimeError(f"agent of {node.name} exited:\n{log_tail(paths.agent_log)}")
        subnet = host_subnet(api, node.name)
        if subnet and socket_answers(paths.socket) and node_ready(api, node.name) is True:
            return subnet
        time.sleep(0.1)
    raise TimeoutError(
        f"agent of {node.name} not ready in {timeout}s:\n{log_tail(paths.agent_log)}"
    )


def log_tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file ('' if it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def ensure_node(state: ClusterState, state_dir: Path, index: int, api: Any, say: Say) -> NodeRecord:
    """Node ``index`` with its namespace, relay and agent running and ready (idempotent)."""
    node = state.nodes.get(f"node{index}") or new_node_record(state, index)
    state.nodes[node.name] = node
    state.save(state_dir)
    create_node_netns(state, state_dir, node)
    paths = prepare_node_files(state, node, state_dir)
    if node.relay is None or not node.relay.alive():
        start_relay(state, node, paths)
        state.save(state_dir)
    if node.agent is not None and node.agent.alive():
        say(f"{node.name}: agent already running (pid {node.agent.pid})")
        return node
    start_agent(state, node, state_dir)
    subnet = wait_agent_ready(node, state_dir, api)
    pid = node.agent.pid if node.agent else 0
    say(f"{node.name}: {node.netns} {node.ip}, subnet {subnet}, agent pid {pid}")
    return node


def restart_agent(state: ClusterState, state_dir: Path, name: str, api: Any) -> NodeRecord:
    """SIGKILL the agent of ``name`` (as a crash would), start it again, wait until ready."""
    node = state.nodes[name]
    stop_agent(node, signal.SIGKILL, timeout=5)
    start_agent(state, node, state_dir)
    wait_agent_ready(node, state_dir, api)
    return node
