"""``FakeDataPlane``: an in-memory backend that validates like a kernel would refuse.

Like openshift/sdn's fake OVS it keeps the state a real backend would build and refuses
what the kernel (or a correct agent) would never allow:

- anything but ``check_node`` before ``setup_node``;
- a second ``attach_pod`` of the same (container, ifname);
- a pod address outside the node subnet, or its network, broadcast or gateway address,
  or one already used by another pod; a gateway other than the node's; an MTU above the
  node's; an empty netns; an interface name the kernel would reject;
- remote subnets overlapping the local subnet or each other, a remote with this node's
  IP, two remotes with one name;
- a node MTU outside 576-9000 or that does not fit the underlay, a vxlan port out of range;
- a policy ``RuleSet`` a backend could not render as it stands: an unknown plugin,
  endpoints unsorted or sharing an IP, policies or a VNID map outside their mode, policies
  unsorted or sharing a key, a rule whose targets are not its policy's, isolation sets
  that are not the union of the isolating policies' targets;
- a ``ServiceTable`` with ports unsorted or sharing a key, two ports on one address,
  protocol and port (or node port), or a cluster IP outside the service network.

What the fake refuses as the kernel refuses input, it refuses permanently
(``DataPlaneRejected``); ``refuse`` names remote nodes and policies (``namespace/name``,
while they hold rules) to refuse that way, as a rendering nft rejects.

Every call is recorded in ``calls`` (method names) so tests can assert, for example, that
``setup_node`` is not called again after a restart. With ``state_file`` the state and the
call history survive the process (for restart tests of ``podnet node --dataplane fake``):
the file (``fakestate``) is rewritten atomically after every change. ``drift_*`` helpers simulate a
hand-made change that the next resync must repair.
"""

from __future__ import annotations

import asyncio
import json
import os
import zlib
from collections.abc import Iterable
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podnet.dataplane.fakestate import FakeState, dump_state, load_state, pod_record
from podnet.dataplane.interface import (
    DataPlaneError,
    DataPlaneRejected,
    DataPlaneStatus,
    NodeNetwork,
    NodeSetupRefused,
    PodAttachment,
    PodNetwork,
    RemoteNode,
)
from podnet.model.network import MULTITENANT, NETWORKPOLICY, PLUGINS

if TYPE_CHECKING:
    from podnet.egress.nodetable import NodeFirewall
    from podnet.policy.model import RuleSet
    from podnet.services.model import ServiceTable

MTU_RANGE = range(576, 9001)
UNDERLAY_MTU = 1500
IFNAME_MAX = 15


def _host_ifname(pod: PodNetwork) -> str:
    """A stable host-side name, as a backend derives it from the pair."""
    return f"veth{zlib.crc32(f'{pod.container_id}/{pod.ifname}'.encode()):08x}"


def _check_ifname(name: str) -> None:
    if not name or len(name.encode()) > IFNAME_MAX or any(c in name for c in "/: \t\n"):
        raise DataPlaneError(f"invalid interface name {name!r}")


class FakeDataPlane:
    """The in-memory ``DataPlane`` for tests (and ``podnet node --dataplane fake``)."""

    def __init__(self, state_file: Path | None = None, underlay_mtu: int = UNDERLAY_MTU) -> None:
        self.state = FakeState()
        self.node: NodeNetwork | None = None
        self.calls: list[str] = []
        self.history: list[str] = []  # calls of earlier processes, from the state file
        self.remote_changes: list[str] = []  # "add x", "update x", "remove x"
        self.policy_changes = 0  # sync_policy calls that brought a new rule set
        self.service_changes = 0  # sync_services calls that brought a new table
        self.egress_firewall: NodeFirewall | None = None  # the last sync_egress_firewall
        self.underlay_mtu = underlay_mtu
        self.state_file = state_file
        self.fail_next: dict[str, Exception] = {}  # method name -> error to raise once
        self.refuse: set[str] = set()  # remote names, policy keys: refused permanently
        self.closed = False
        self._owner_cache: dict[IPv4Address, tuple[str, str]] | None = None
        self._pod_records: dict[tuple[str, str], dict[str, Any]] = {}
        if state_file is not None and state_file.exists():
            self._load(state_file)

    # ---- the DataPlane protocol --------------------------------------------------------

    async def check_node(self, node: NodeNetwork) -> DataPlaneStatus:
        """Ok when the version note matches ``node``'s (a set-up of the same network)."""
        self._record("check_node")
        if not self.state.version_note:
            return DataPlaneStatus(False, ["no version note: the node was never set up"])
        if self.state.version_note != node.version_note():
            return DataPlaneStatus(False, [f"version note is {self.state.version_note!r}"])
        self.node = node
        return DataPlaneStatus(True)

    async def setup_node(self, node: NodeNetwork) -> None:
        """Validate ``node`` and remember it; the version note is written last."""
        self._record("setup_node")
        self._fail("setup_node")
        self._validate_node(node)
        self.node = node
        self.state.version_note = node.version_note()
        self._save()

    async def sync_remote_nodes(self, node: NodeNetwork, remotes: list[RemoteNode]) -> None:
        """Validate the whole desired set, then apply only the differences."""
        self._record("sync_remote_nodes")
        self._fail("sync_remote_nodes")
        self._require_setup()
        self._validate_remotes(node, remotes)
        self._refuse(r.name for r in remotes)
        desired = {r.name: r for r in remotes}
        for name in sorted(self.state.remotes.keys() - desired.keys()):
            self.remote_changes.append(f"remove {name}")
            del self.state.remotes[name]
        for name, remote in sorted(desired.items()):
            if self.state.remotes.get(name) != remote:
                verb = "update" if name in self.state.remotes else "add"
                self.remote_changes.append(f"{verb} {name}")
                self.state.remotes[name] = remote
        self._save()

    async def attach_pod(self, pod: PodNetwork) -> PodAttachment:
        """Refuse anything a kernel or a correct agent would not do; record the pod."""
        self._record("attach_pod")
        self._fail("attach_pod")
        node = self._require_setup()
        self._validate_pod(node, pod)
        attachment = PodAttachment(
            container_id=pod.container_id,
            host_ifname=_host_ifname(pod),
            ifname=pod.ifname,
            mac=pod.mac,
            sandbox=pod.netns,
            address=pod.address,
            gateway=pod.gateway,
            mtu=pod.mtu,
        )
        self._put_pod(attachment, pod.routes)
        return attachment

    async def detach_pod(self, container_id: str, ifname: str, netns: str | None) -> None:
        """Forget the pod; fine when it is already gone."""
        self._record("detach_pod")
        self._fail("detach_pod")
        if self.state.pods.pop((container_id, ifname), None) is not None:
            self.state.pod_routes.pop((container_id, ifname), None)
            self._owner_cache = None
            self._pod_records.pop((container_id, ifname), None)
            self._save()

    async def attached_pods(self) -> list[PodAttachment]:
        """Every pod attached, sorted by address."""
        self._record("attached_pods")
        return sorted(self.state.pods.values(), key=lambda a: a.address)

    async def sync_policy(self, node: NodeNetwork, rules: RuleSet) -> None:
        """Validate ``rules``, then hold them and their fingerprint (the same object again,
        a resync, is neither validated nor fingerprinted again)."""
        self._record("sync_policy")
        self._fail("sync_policy")
        self._require_setup()
        if rules is not self.state.policy:
            _validate_rules(rules)
            self._refuse(p.key for p in rules.policies if p.rules)
            fingerprint = await asyncio.to_thread(rules.fingerprint)  # ~1 s at 5,000 pods
            self.state.policy, self.state.policy_fingerprint = rules, fingerprint
            self.policy_changes += 1
        self._save()

    async def sync_services(self, node: NodeNetwork, table: ServiceTable) -> None:
        """Validate ``table`` (``services.model.table_problems``), then hold it; services
        named in ``refuse`` are refused as a rendering nft rejects."""
        from podnet.services.model import table_problems

        self._record("sync_services")
        self._fail("sync_services")
        self._require_setup()
        if table is not self.state.services:
            problems = table_problems(table, node.service_network)
            if problems:
                raise DataPlaneRejected("service table refused: " + "; ".join(problems))
            self._refuse(table.services())
            self.state.services = table
            self.service_changes += 1

    async def sync_egress_firewall(self, node: NodeNetwork, firewall: NodeFirewall) -> None:
        """Hold ``firewall`` (the pods it names and the intervals they may not reach)."""
        self._record("sync_egress_firewall")
        self._fail("sync_egress_firewall")
        self._require_setup()
        self.egress_firewall = firewall

    async def close(self) -> None:
        """Nothing to release; remembered for tests."""
        self._record("close")
        self.closed = True

    # ---- test helpers --------------------------------------------------------------------

    def drift_remove_remote(self, name: str) -> None:
        """Simulate a route deleted by hand: the remote vanishes from the "kernel"."""
        self.state.remotes.pop(name, None)
        self._save()

    def drift_sandbox_gone(self, container_id: str, ifname: str) -> None:
        """Simulate a pod's network namespace deleted without a DEL: the kernel removes
        its veth, so the pod is no longer wired (the "kernel" forgets it)."""
        self.state.pods.pop((container_id, ifname), None)
        self.state.pod_routes.pop((container_id, ifname), None)
        self._save()

    def drift_version_note(self, note: str = "") -> None:
        """Simulate a half-done or foreign set-up: the next ``check_node`` fails."""
        self.state.version_note = note
        self._save()

    def vtep_peers(self) -> set[IPv4Address]:
        """The addresses a real backend would accept tunnel traffic from: the remotes'."""
        return {r.node_ip for r in self.state.remotes.values()}

    def count(self, method: str) -> int:
        """How many times ``method`` was called, in this process and (from the state file)
        in earlier ones."""
        return self.history.count(method) + self.calls.count(method)

    # ---- validation ----------------------------------------------------------------------

    def _validate_node(self, node: NodeNetwork) -> None:
        if node.mtu not in MTU_RANGE:
            raise NodeSetupRefused(f"MTU {node.mtu} is outside {MTU_RANGE.start}-9000")
        if node.mtu > self.underlay_mtu - node.tunnel_overhead:
            raise NodeSetupRefused(
                f"MTU {node.mtu} does not fit the underlay MTU {self.underlay_mtu} "
                f"minus {node.tunnel_overhead}"
            )
        if not 1 <= node.vxlan_port <= 65535:
            raise NodeSetupRefused(f"vxlan port {node.vxlan_port} is out of range")
        if not any(node.subnet.subnet_of(n) for n in node.cluster_networks):
            raise NodeSetupRefused(f"subnet {node.subnet} is outside the cluster networks")
        if any(node.node_ip in n for n in node.cluster_networks):
            raise NodeSetupRefused(f"node IP {node.node_ip} is inside a cluster network")

    def _validate_remotes(self, node: NodeNetwork, remotes: list[RemoteNode]) -> None:
        names: set[str] = set()
        for i, remote in enumerate(remotes):
            if remote.name in names or remote.name == node.node_name:
                raise DataPlaneRejected(f"remote node {remote.name} listed twice or is this node")
            names.add(remote.name)
            if remote.node_ip == node.node_ip:
                raise DataPlaneRejected(f"remote node {remote.name} has this node's IP")
            if remote.subnet.overlaps(node.subnet):
                raise DataPlaneRejected(f"remote subnet {remote.subnet} overlaps {node.subnet}")
            for other in remotes[:i]:
                if remote.subnet.overlaps(other.subnet):
                    raise DataPlaneRejected(f"remote subnets {remote.subnet} and {other.subnet}")

    def _validate_pod(self, node: NodeNetwork, pod: PodNetwork) -> None:
        key = (pod.container_id, pod.ifname)
        if key in self.state.pods:
            raise DataPlaneError(f"interface {pod.ifname} of {pod.container_id} already exists")
        if not pod.netns:
            raise DataPlaneError("no network namespace given")
        _check_ifname(pod.ifname)
        self._validate_address(node, pod.address)
        if pod.gateway != node.gateway.ip:
            raise DataPlaneError(f"gateway {pod.gateway} is not the node's {node.gateway.ip}")
        if pod.mtu > node.mtu:
            raise DataPlaneError(f"pod MTU {pod.mtu} exceeds the node's {node.mtu}")

    def _validate_address(self, node: NodeNetwork, address: IPv4Interface) -> None:
        reserved = {node.subnet.network_address, node.subnet.broadcast_address, node.gateway.ip}
        if address.network != node.subnet or address.ip in reserved:
            raise DataPlaneError(f"pod address {address} is not usable in {node.subnet}")
        owner = self._owners().get(address.ip)
        if owner is not None:
            raise DataPlaneError(f"pod address {address.ip} is already used by {owner}")

    def _owners(self) -> dict[IPv4Address, tuple[str, str]]:
        if self._owner_cache is None:
            self._owner_cache = {a.address.ip: k for k, a in self.state.pods.items()}
        return self._owner_cache

    def _require_setup(self) -> NodeNetwork:
        if self.node is None or self.state.version_note != self.node.version_note():
            raise DataPlaneError("the node is not set up")
        return self.node

    def _refuse(self, names: Iterable[str]) -> None:
        refused = sorted(self.refuse.intersection(names))
        if refused:
            raise DataPlaneRejected(f"refused as the kernel would: {', '.join(refused)}")

    def _fail(self, method: str) -> None:
        error = self.fail_next.pop(method, None)
        if error is not None:
            raise error

    # ---- persistence ---------------------------------------------------------------------

    def _put_pod(self, attachment: PodAttachment, routes: tuple[IPv4Network, ...]) -> None:
        pair = (attachment.container_id, attachment.ifname)
        self.state.pods[pair] = attachment
        self.state.pod_routes[pair] = routes
        self._owners()[attachment.address.ip] = pair
        if self.state_file is not None:
            self._pod_records[pair] = pod_record(attachment, routes)
        self._save()

    def _record(self, method: str) -> None:
        self.calls.append(method)
        if method in ("check_node", "setup_node"):
            self._save()

    def _save(self) -> None:
        if self.state_file is None:
            return
        tmp = self.state_file.with_name(f".{self.state_file.name}.{os.getpid()}.tmp")
        records = [
            self._pod_records.get(k) or pod_record(a, self.state.pod_routes.get(k, ()))
            for k, a in self.state.pods.items()
        ]
        tmp.write_text(json.dumps(dump_state(self.state, records, self.history + self.calls)))
        os.replace(tmp, self.state_file)

    def _load(self, path: Path) -> None:
        data = json.loads(path.read_text())
        self.history = list(data.get("calls") or [])
        self.state = load_state(data)
        self._pod_records = {(p["container_id"], p["ifname"]): p for p in data.get("pods", [])}


def _validate_rules(rules: RuleSet) -> None:
    """Refuse a rule set a backend could not render as it stands (module docstring)."""
    problems = []
    if rules.plugin not in PLUGINS:
        problems.append(f"unknown plugin {rules.plugin!r}")
    ips = [e.ip for e in rules.endpoints]
    if ips != sorted(set(ips)):
        problems.append("endpoints are not sorted by IP, or share an IP")
    if (rules.isolation is not None) != (rules.plugin == MULTITENANT):
        problems.append(f"a VNID map must come with {MULTITENANT} and only with it")
    if rules.policies and rules.plugin != NETWORKPOLICY:
        problems.append(f"policies outside {NETWORKPOLICY}")
    problems += _policy_problems(rules)
    if problems:
        raise DataPlaneRejected("policy rule set refused: " + "; ".join(problems))


def _policy_problems(rules: RuleSet) -> list[str]:
    problems = []
    keys = [p.key for p in rules.policies]
    if keys != sorted(set(keys)):
        problems.append("policies are not sorted by key, or share a key")
    for policy in rules.policies:
        if any(
            r.targets is not policy.targets and r.targets != policy.targets for r in policy.rules
        ):
            problems.append(f"policy {policy.key} has a rule with other targets")
    isolated = {"ingress": rules.ingress_isolated, "egress": rules.egress_isolated}
    for direction, found in isolated.items():
        targets = {p.targets for p in rules.policies if getattr(p, direction)}
        if found != frozenset().union(*targets):
            problems.append(f"{direction}_isolated is not the union of the isolating targets")
    return problems
