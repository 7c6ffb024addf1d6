"""What the e2e suites look at inside a node's data plane, on linux or on ovs.

The suites run the same behaviour tests on either data plane (``TEST_DATAPLANE``). A few
of them also look inside a node: whether its policy is in place yet, what it holds for
a remote node, the tunnel parameters a forged VXLAN frame needs. Each such look has the
same meaning on both planes and a different place to read it from:

- linux: nftables' ``inet podnet_policy`` table, routes and the bridge's FDB, ``vxlan0``
  (a kernel device, its VNI and port) and ``br0`` (the gateway);
- ovs: br0's OpenFlow tables 21 and 80 (``policyflows``), br0's flows towards a remote
  node (``tun_dst``/``tun_src``), ``vxlan0`` as an OVS port (``key=flow``: the VNID of the
  sender's namespace, 0 outside multitenant) and ``tun0`` (the gateway), all read from
  the root namespace through the node's own OVS sockets.

The chaos test (``chaoscheck``) asks what a node holds for its pods: the host veths (the
same on both planes), the switch's pod ports (linux: veths whose master is ``br0``; ovs:
br0's OVSDB ports, each with an ofport and the identity of the pod its name is for), the
anti-spoofing entries, and, on ovs, whether br0's flows are exactly the desired ones
(``pipeline.desired`` and the version note, for the node's network, remote nodes, live
pods and rule set, compared by ``ovs-ofctl diff-flows``).
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any, cast

from podnet import netns
from podnet.agent.config import AgentConfig, node_network
from podnet.agent.remotes import remote_nodes
from podnet.cluster import pods
from podnet.cluster.ovsnodes import node_ovs_base, running
from podnet.cluster.state import ClusterState, NodeRecord
from podnet.dataplane.interface import NodeNetwork, Tunnel, pod_mac
from podnet.dataplane.linux.desired import BRIDGE as LINUX_BRIDGE
from podnet.dataplane.linux.desired import vtep_mac
from podnet.dataplane.linux.policyscript import parse_listing, transaction
from podnet.dataplane.linux.policytable import PolicyRenderer
from podnet.dataplane.linux.policyvalues import TABLE_KEY
from podnet.dataplane.ovs import pipeline
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.flow import Flow, flows_text
from podnet.dataplane.ovs.flowstate import as_read_back, note
from podnet.dataplane.ovs.instance import OvsPaths
from podnet.dataplane.ovs.ovsdb import Port
from podnet.dataplane.ovs.ovspods import attachment_of
from podnet.dataplane.ovs.pipeline import LocalPod
from podnet.dataplane.wiring import host_veth_name, is_host_veth_name
from podnet.model.kinds import CLUSTER_NETWORK, HOST_SUBNET
from podnet.policy.model import RuleSet
from podnet.policy.trace import fetch_objects
from podnet.testing.lab import policy_table

POLICY_TABLES = (t.EGRESS_POLICY, t.ISOLATION)  # tables 21 and 80: what policyflows owns
OVS_GLOBAL_VNID = 0  # the tunnel id of every pod outside multitenant mode
SHOWN_FLOWS = 5  # differing flows named in a problem
Obj = dict[str, Any]


def _ovs(state_dir: Path, node: str) -> OvsPaths:
    return OvsPaths(node_ovs_base(state_dir, node))


def ofctl(state_dir: Path, node: str, *args: str) -> str:
    """``ovs-ofctl -O OpenFlow13 ARGS`` against ``node``'s own switch; its output."""
    done = subprocess.run(
        ["ovs-ofctl", "-O", "OpenFlow13", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=_ovs(state_dir, node).env(),
    )
    if done.returncode not in (0, 2):  # diff-flows exits 2 when it found differences
        raise RuntimeError(f"ovs-ofctl {' '.join(args)} on {node}: {done.stderr.strip()}")
    return done.stdout


def br0_flows(state_dir: Path, node: str, match: str = "") -> str:
    """br0's flows on ``node`` as ``dump-flows --no-stats`` shows them."""
    return ofctl(state_dir, node, "--no-stats", "--no-names", "dump-flows", t.BRIDGE, match)


def _policy_dump(state_dir: Path, node: str) -> list[str]:
    lines: list[str] = []
    for table in POLICY_TABLES:
        lines += br0_flows(state_dir, node, f"table={table}").splitlines()
    return sorted(line.strip() for line in lines if "actions=" in line)


def vsctl(state_dir: Path, node: str, *args: str) -> str:
    """``ovs-vsctl ARGS`` against ``node``'s own database; its output. (A tool per look,
    not an OVSDB client: the tests ask again and again, and a process leaves nothing.)"""
    db = f"--db=unix:{_ovs(state_dir, node).db_socket}"
    argv = ["ovs-vsctl", db, "--timeout=10", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


def _ovs_ports(state_dir: Path, node: str) -> list[Port]:
    """br0's ports on ``node`` (its own port left out), from its OVSDB: each one's
    interface's ofport (-1: none) and external_ids."""
    names = vsctl(state_dir, node, "list-ports", t.BRIDGE).split()
    columns = "--columns=name,ofport,external_ids"
    table = json.loads(vsctl(state_dir, node, "--format=json", columns, "list", "Interface"))
    interfaces = {row[0]: row for row in table["data"]}
    ports = []
    for name in sorted(names):
        _, ofport, ids = interfaces.get(name, (name, -1, ["map", []]))
        number = ofport if isinstance(ofport, int) else -1  # ["set", []]: none yet
        ports.append(Port(name, "", number, {str(k): str(v) for k, v in ids[1]}))
    return ports


def ovs_port_numbers(state_dir: Path, node: str) -> dict[IPv4Address, int]:
    """The node's pods (by IP) and their OpenFlow port numbers, from its OVSDB."""
    found = {}
    for port in _ovs_ports(state_dir, node):
        pod = attachment_of(port.name, port.external_ids)
        if pod is not None and port.ofport > 0:
            found[pod.address.ip] = port.ofport
    return found


def pod_veths(node_ns: str) -> dict[str, str | None]:
    """Every host-side pod veth in the node namespace -> its master (None if none)."""
    links = _ip_json(node_ns, "link", "show")
    return {k["ifname"]: k.get("master") for k in links if is_host_veth_name(k["ifname"])}


def pod_port_elements(node_ns: str) -> set[tuple[str, str, str]]:
    """linux: the ``bridge podnet pod_ports`` elements as (veth, MAC, IP)."""
    argv = ["nft", "-j", "list", "set", "bridge", "podnet", "pod_ports"]
    out = netns.run(node_ns, argv, check=True).stdout
    found = set()
    for item in json.loads(out)["nftables"]:
        for elem in (item.get("set") or {}).get("elem", []):
            veth, mac, ip = elem["concat"]
            found.add((str(veth), str(mac).lower(), str(ip)))
    return found


def pod_ports(state_dir: Path, state: ClusterState, node: str) -> set[str]:
    """The switch's pod ports on ``node``: linux, the pod veths whose master is br0; ovs,
    br0's podnet-named OVSDB ports, one without an ofport or whose identity is not that
    of the pod its name is for shown with what is wrong (``pn... (ofport -1)``)."""
    if state.dataplane != "ovs":
        veths = pod_veths(state.nodes[node].netns)
        return {name for name, master in veths.items() if master == LINUX_BRIDGE}
    ports = _ovs_ports(state_dir, node)
    return {p.name + _port_fault(p) for p in ports if is_host_veth_name(p.name)}


def _port_fault(port: Port) -> str:
    pod = attachment_of(port.name, port.external_ids)
    if port.ofport <= 0:
        return f" (ofport {port.ofport})"
    if pod is None:
        return " (no pod identity)"
    if host_veth_name(pod.container_id, pod.ifname) != port.name:
        return f" (identity of {pod.container_id[:12]}/{pod.ifname})"
    return ""


def flow_problems(
    state_dir: Path, state: ClusterState, node: str, live: Iterable[tuple[str, str, IPv4Address]]
) -> list[str]:
    """ovs: how br0's flows on ``node`` differ from the desired ones (``pipeline.desired``
    and the note) for its network, the remote nodes, the rule set compiled from the API
    and ``live`` (container ID, ifname, IP of each pod there, at its OVSDB port's number),
    as stale and missing flows; linux: none (no switch: see the veths and pod_ports)."""
    if state.dataplane != "ovs":
        return []
    with pods.admin_api(state_dir) as api:
        subnets, cluster = _network_objects(api)
        rules = fetch_objects(api).ruleset()
    network = _node_networks(state, subnets, cluster)[node]
    ofports = {port.name: port.ofport for port in _ovs_ports(state_dir, node)}
    local = [
        LocalPod(f"{container_id}/{ifname}", ofport, ip, pod_mac(ip))
        for container_id, ifname, ip in live
        if (ofport := ofports.get(host_veth_name(container_id, ifname), -1)) > 0
    ]
    groups = pipeline.desired(network, remote_nodes(subnets.values(), node), local, rules)
    want = [as_read_back(flow) for flows in groups.values() for flow in flows]
    return diff_problems(node, _differences(state_dir, node, None, [*want, note(network)]))


def diff_problems(node: str, diff: str) -> list[str]:
    """``diff-flows`` of br0 against the desired flows as problems: its ``-`` lines are
    flows only br0 holds (stale), its ``+`` lines flows it lacks (missing)."""
    problems = []
    for sign, what in (("-", "stale"), ("+", "missing")):
        found = [line[1:].strip() for line in diff.splitlines() if line.startswith(sign)]
        if found:
            problems.append(f"{node} {t.BRIDGE}: {len(found)} {what} flow(s) {found[:SHOWN_FLOWS]}")
    return problems


_POD_IN = re.compile(r"\bip,in_port=(\d+),dl_src=([0-9a-f:]+),nw_src=([0-9.]+) ")


def anti_spoofing(state_dir: Path, state: ClusterState, node: str) -> set[tuple[str, str, str]]:
    """(host veth, MAC, IP) that ``node`` lets each pod send with: linux, the elements of
    the ``pod_ports`` set; ovs, table 20's per-pod IP flows (in_port named by OVSDB)."""
    if state.dataplane != "ovs":
        return pod_port_elements(state.nodes[node].netns)
    names = {port.ofport: port.name for port in _ovs_ports(state_dir, node)}
    found = set()
    for line in br0_flows(state_dir, node, f"table={t.POD_IN}").splitlines():
        match = _POD_IN.search(line)
        if match:
            found.add((names.get(int(match[1]), match[1]), match[2].lower(), match[3]))
    return found


def gateway(state: ClusterState, node: str) -> IPv4Address:
    """``node``'s address towards its pods: on br0 (linux) or tun0 (ovs)."""
    device = t.TUN if state.dataplane == "ovs" else "br0"
    links = _ip_json(state.nodes[node].netns, "-4", "addr", "show", device)
    return IPv4Address(links[0]["addr_info"][0]["local"])


def _ip_json(namespace: str, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["ip", "-j", "-n", namespace, *args], capture_output=True, text=True, check=True, timeout=10
    ).stdout
    return list(json.loads(out or "[]"))


def tunnel(state_dir: Path, state: ClusterState, node: str) -> tuple[int, int, str]:
    """What a VXLAN frame for ``node``'s VTEP carries: tunnel id, UDP port, inner MAC."""
    record = state.nodes[node]
    if state.dataplane == "ovs":
        port = vsctl(state_dir, node, "get", "Interface", t.VXLAN, "options:dst_port")
        link = _ip_json(record.netns, "link", "show", t.TUN)[0]
        return OVS_GLOBAL_VNID, int(port.strip().strip('"')), str(link["address"])
    info = _ip_json(record.netns, "-d", "link", "show", "vxlan0")[0]["linkinfo"]["info_data"]
    return int(info["id"]), int(info["port"]), vtep_mac(IPv4Address(record.ip))


def switch_flows(state_dir: Path, state: ClusterState, node: str) -> str | None:
    """ovs: br0's whole flow table on ``node`` (no counters); linux: None (no switch)."""
    return br0_flows(state_dir, node) if state.dataplane == "ovs" else None


def switch_pids(state_dir: Path, state: ClusterState) -> dict[int, bytes]:
    """The nodes' running OVS daemons: PID → command line (none on linux)."""
    found = {}
    for name in state.nodes:
        for pid in running(node_ovs_base(state_dir, name)).values():
            found[pid] = _cmdline(pid)
    return found


def switches_left(before: Mapping[int, bytes]) -> list[int]:
    """The daemons of ``switch_pids`` still running (the same PID and command line)."""
    return [pid for pid, line in before.items() if _cmdline(pid) == line]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def remote_node_state(state_dir: Path, state: ClusterState, node: NodeRecord) -> str:
    """What ``node`` holds to reach other nodes: its routes, and its bridge's FDB (linux)
    or br0's flows (ovs), as text to look for a remote's subnet or IP in."""
    routes = subprocess.run(
        ["ip", "-n", node.netns, "route"], capture_output=True, text=True, check=True, timeout=10
    ).stdout
    if state.dataplane == "ovs":
        return routes + br0_flows(state_dir, node.name)
    fdb = subprocess.run(
        ["bridge", "-n", node.netns, "fdb", "show"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    return routes + fdb


def policy_behind(state_dir: Path, state: ClusterState, rules: RuleSet) -> list[str]:
    """The nodes whose data plane does not hold ``rules`` rendered for them yet: linux,
    the nftables table (compared as a transaction: none needed); ovs, br0's tables 21 and
    80 as the pipeline renders them for the node's network and pods (compared by
    ``ovs-ofctl diff-flows``: no difference)."""
    networks: dict[str, NodeNetwork] = {}
    if state.dataplane == "ovs":
        with pods.admin_api(state_dir) as api:
            networks = _node_networks(state, *_network_objects(api))
    late = []
    for name, node in state.nodes.items():
        if state.dataplane == "ovs":
            held = name in networks and _ovs_policy_held(state_dir, networks[name], rules)
        else:
            done = netns.run(node.netns, ["nft", "-t", "list", "table", *TABLE_KEY.split()], 30)
            have = parse_listing(done.stdout) if done.returncode == 0 else None
            held = not transaction(have, PolicyRenderer(name).render(rules))
        if not held:
            late.append(name)
    return late


def _network_objects(api: Any) -> tuple[dict[str, Obj], Obj]:
    """The HostSubnets by name, and the ClusterNetwork ``default``."""
    subnets = {item["metadata"]["name"]: item for item in api.list(HOST_SUBNET)["items"]}
    clusters = api.list(CLUSTER_NETWORK)["items"]
    return subnets, next(item for item in clusters if item["metadata"]["name"] == "default")


def _node_networks(
    state: ClusterState, subnets: Mapping[str, Obj], cluster: Obj
) -> dict[str, NodeNetwork]:
    """Each node's ``NodeNetwork`` as its agent builds it (HostSubnet, ClusterNetwork)."""
    return {
        name: node_network(
            AgentConfig(node_name=name, tunnel=cast("Tunnel", state.tunnel)),
            IPv4Address(node.ip),
            subnets[name],
            cluster,
        )
        for name, node in state.nodes.items()
        if name in subnets
    }


def _ovs_policy_held(state_dir: Path, network: NodeNetwork, rules: RuleSet) -> bool:
    name = network.node_name
    ports = ovs_port_numbers(state_dir, name)
    local = [LocalPod(str(ip), ofport, ip, "") for ip, ofport in ports.items()]
    groups = pipeline.policy_flows(network, rules, local)
    want = [flow for flows in groups.values() for flow in flows]
    return not _differences(state_dir, name, "\n".join(_policy_dump(state_dir, name)), want)


def _differences(state_dir: Path, node: str, have: str | None, want: list[Flow]) -> str:
    """``diff-flows`` of ``have`` (dump text; None: br0 itself) and ``want``: ``-`` lines
    only in the first, ``+`` lines only in ``want``."""
    with tempfile.TemporaryDirectory() as folder:
        source, want_file = t.BRIDGE, Path(folder) / "want"
        if have is not None:
            source = str(Path(folder) / "have")
            Path(source).write_text(have + "\n")
        want_file.write_text(flows_text(want))
        return ofctl(state_dir, node, "--no-names", "diff-flows", source, str(want_file))


def policy_snapshot(state_dir: Path, state: ClusterState, name: str) -> object:
    """``name``'s policy as held now, comparable with a later snapshot (None: no table)."""
    if state.dataplane == "ovs":
        return _policy_dump(state_dir, name) or None
    return policy_table(state.nodes[name].netns)


def drop_policy(state_dir: Path, state: ClusterState, name: str) -> None:
    """Remove ``name``'s policy from its data plane (as a crash or an admin could)."""
    if state.dataplane == "ovs":
        for table in POLICY_TABLES:
            ofctl(state_dir, name, "del-flows", t.BRIDGE, f"table={table}")
        return
    argv = ["nft", "delete", "table", *TABLE_KEY.split()]
    netns.run(state.nodes[name].netns, argv, timeout=30)


def snapshots(state_dir: Path, state: ClusterState) -> Mapping[str, object]:
    """Every node's ``policy_snapshot``."""
    return {name: policy_snapshot(state_dir, state, name) for name in state.nodes}
