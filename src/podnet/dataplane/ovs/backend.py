"""``OvsDataPlane``: the DataPlane contract on Open vSwitch, OpenShift SDN's br0.

The node's own ``ovsdb-server`` and ``ovs-vswitchd`` (``daemons``, under ``<state dir>/ovs``)
run in the node's namespace and outlive the agent; a restarted agent adopts them. br0
holds the pipeline (``pipeline``, tables 21/80 from ``policyflows``), kept equal to what the
agent said by ``FlowSync``: one bundle per change, grouped by object, the note last; a
whole-table ``replace-flows`` (only the difference is sent) when the plane starts, after
``ovs-vswitchd`` restarted, at ``setup_node`` and at every ``sync_remote_nodes`` and
policy resync, so drift is repaired. ``flowstate`` keeps the groups the agent has not told
the plane about yet as the switch holds them, so a restarted agent changes nothing.

Namespace rule (as ``linux``): construct the plane in the node's namespace. Kernel work
(tun0, routes, nftables, veths) runs on worker threads made there (``linux.workers``);
OVSDB and OpenFlow are unix sockets, reached from anywhere.

    with podnet.netns.entered("node-1"):
        plane = OvsDataPlane(state_dir / "ovs")
    await plane.setup_node(node)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

from podnet.dataplane.interface import DataPlaneError, DataPlaneStatus
from podnet.dataplane.linux.egressnft import EgressFirewallNft
from podnet.dataplane.linux.netlink import Netlink
from podnet.dataplane.linux.services import ServiceTableSync
from podnet.dataplane.linux.workers import NamespaceWorker, namespace_id
from podnet.dataplane.ovs import hostnet, megaflows, ovspods
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.daemons import OVSDB_SERVER, VSWITCHD, OvsDaemons
from podnet.dataplane.ovs.flowstate import FlowState, parse_dump
from podnet.dataplane.ovs.flowsync import FlowSync, SyncResult
from podnet.dataplane.ovs.nodeports import NodePorts, flow_problems
from podnet.dataplane.ovs.ofctl import OfctlRunner
from podnet.dataplane.ovs.pipeline import LocalPod
from podnet.dataplane.ovs.underlaysetup import NodeKernel
from podnet.dataplane.wiring import host_veth_name
from podnet.egress.nodetable import NodeFirewall
from podnet.policy.model import RuleSet
from podnet.services.model import ServiceTable

if TYPE_CHECKING:
    from podnet.dataplane.interface import NodeNetwork, PodAttachment, PodNetwork, RemoteNode

log = logging.getLogger(__name__)
T = TypeVar("T")
CALL_TIMEOUT = 10.0
SETUP_TIMEOUT = 60.0
POD_THREADS = 4


class OvsDataPlane:
    """The ``ovs`` backend (see the module docstring for the namespace rule)."""

    def __init__(self, base: Path, *, timeout: float = CALL_TIMEOUT) -> None:
        self.timeout = timeout
        self.daemons = OvsDaemons(base)
        self._kernel = NodeKernel()  # the node thread: netlink, sysctls, nft, in order
        self._pod_threads = NamespaceWorker(f"podnet-ovs-pods-{namespace_id()}", POD_THREADS)
        self.runner = OfctlRunner(self.daemons.paths)
        self.flows = FlowSync(self.runner)
        self.state = FlowState()
        self.ports = NodePorts(self.daemons, self.runner, self._kernel)
        self.services = ServiceTableSync()
        self.egress = EgressFirewallNft()  # the host's: a pod's way out is through tun0
        self._adopted = False  # whether state.adopted was read from the switch
        self._supervisor: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def create(cls, base: Path) -> OvsDataPlane:
        """Construct in the current thread's namespace."""
        return cls(base)

    # --- the node ----------------------------------------------------------------------

    async def check_node(self, node: NodeNetwork) -> DataPlaneStatus:
        """Compare the daemons, OVSDB, the host and the flows with ``node``; change
        nothing. A node found right is remembered (the agent then skips set-up)."""
        problems = await self.ports.problems(node)
        if not problems:
            await self._load()
            problems += await self._node(
                "check_node", lambda nl: hostnet.problems(nl, node, self.state.remotes)
            )
            problems += await self._flow_problems(node)
            problems += await self._dead_pod_ports()
        if not problems:
            self.state.node = node
            self._supervise()
        return DataPlaneStatus(ok=not problems, problems=problems)

    async def _dead_pod_ports(self) -> list[str]:
        """Pod ports whose veth is gone: its pod's network namespace was deleted without a
        DEL (OVSDB keeps the port, and its ofport too for a while). ``setup_node`` removes
        them, so ``attached_pods`` stops listing the pod and its address is released."""
        return [
            f"pod port {name} has no device (its sandbox is gone)" for name in await self._gone()
        ]

    async def _gone(self) -> list[str]:
        """Pod ports on br0 whose veth is not in the kernel (an ADD makes the veth before
        the port, so no port in the middle of an ADD is among them)."""
        names = await self.ports.pod_port_names()
        if not names:
            return []
        return await self._node(
            "pod ports", lambda nl: sorted(set(names) - {link.name for link in nl.links()})
        )

    async def setup_node(self, node: NodeNetwork) -> None:
        """Start (or adopt) the daemons, build br0 and its ports, the host's side, then
        the flows (the whole table compared; the note last)."""
        await self._within("setup_node", self.ports.ensure(node), SETUP_TIMEOUT)
        self._supervise()
        await self._load()
        await self._node("setup_node", lambda nl: hostnet.ensure(nl, node, self.state.remotes))
        wired = await self.ports.remove_orphans(await self._gone())
        for key in list(self.state.pods):
            if host_veth_name(*key.split("/", 1)) not in wired:
                del self.state.pods[key]  # its port is gone: so are its flows
        await self._node("setup_node", lambda nl: ovspods.remove_stray_veths(nl, wired))
        self.state.node = node
        await self._sync_flows(whole=True)

    async def sync_remote_nodes(self, node: NodeNetwork, remotes: list[RemoteNode]) -> None:
        """Host routes (host-gw) and VXLAN peers, then the remote nodes' flows (the whole
        table compared, so a flow removed by hand comes back). host-gw: remotes not on
        the underlay's L2 segment get nothing and are refused at the end."""
        self._require(node)
        refused = await self._node(
            "sync_remote_nodes", lambda nl: hostnet.refused_remotes(nl, node, remotes)
        )
        chosen = [r for r in remotes if r.name not in refused]
        await self._node("sync_remote_nodes", lambda nl: hostnet.sync_remotes(nl, node, chosen))
        self.state.remotes = chosen
        await self._sync_flows(whole=True)
        await self._within("peers", self.ports.peers(node, chosen))
        hostnet.refuse(refused)

    # --- pods ----------------------------------------------------------------------------

    async def attach_pod(self, pod: PodNetwork) -> PodAttachment:
        """veth and pod side; then, at once, the OVS port (its ofport chosen here, the
        pod's identity in external_ids) and its flows (which match nothing until the port
        is there). Undone on failure."""
        self._require(None)
        host = host_veth_name(pod.container_id, pod.ifname)
        await self._pod("attach_pod", lambda: ovspods.wire(pod, host))
        key = f"{pod.container_id}/{pod.ifname}"
        known = self.state.pods.get(key)  # wired again: it keeps its port number
        ofport = known.ofport if known is not None else self._free_ofport()
        self.state.pods[key] = LocalPod(key, ofport, pod.address.ip, pod.mac)
        try:
            await _together(
                self.ports.add_pod(host, ofport, ovspods.identity(pod)), self._sync_flows()
            )
        except BaseException:
            await self._forget_pod(pod.container_id, pod.ifname, host)
            raise
        return ovspods.attachment_of(host, ovspods.identity(pod)) or _never(host)

    async def detach_pod(self, container_id: str, ifname: str, netns: str | None) -> None:
        """Flows first, then the OVS port, then the veth; whatever is gone is fine."""
        await self._load()
        host = host_veth_name(container_id, ifname)
        await self._forget_pod(container_id, ifname, host)

    async def attached_pods(self) -> list[PodAttachment]:
        """The pods wired on this node, from OVSDB."""
        await self._load()
        return await self.ports.attached()

    # --- policy and services ------------------------------------------------------------

    async def sync_policy(self, node: NodeNetwork, rules: RuleSet) -> None:
        """VNIDs and tables 21/80 for ``rules``: one bundle of the groups that changed; the
        whole table compared when the rules are the last ones again (a resync). When the
        verdicts may have changed, the datapath's cached flows go too (``megaflows``), so
        the policy is in force for every packet once this returns."""
        self._require(node)
        same = self.state.rules_known and rules is self.state.rules
        resync = not self.state.rules_known or same
        self.state.rules, self.state.rules_known = rules, True
        done = await self._sync_flows(whole=resync)
        if done is not None and megaflows.verdicts_changed(done.mode, same):
            # no cached datapath flow may keep the old verdict (see megaflows)
            await self._within("datapath flow purge", megaflows.forget_verdicts(self.runner))

    async def sync_services(self, node: NodeNetwork, table: ServiceTable) -> None:
        """The host's nftables service proxy (the linux data plane's), for tun0."""
        await self._node("sync_services", lambda _: self.services.sync(node, table), SETUP_TIMEOUT)

    async def sync_egress_firewall(self, node: NodeNetwork, firewall: NodeFirewall) -> None:
        """The host's ``table inet podnet_egress``, as on linux: what leaves by tun0 and
        is forwarded by the host (services DNATed there included) is judged there."""
        await self._node(
            "sync_egress_firewall", lambda _: self.egress.sync(node, firewall), SETUP_TIMEOUT
        )

    async def close(self) -> None:
        """Stop supervising, close OVSDB and the threads; the daemons keep running."""
        if self._closed:
            return
        self._closed = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
        await self.ports.close()
        await self._kernel(lambda _: self.services.close())
        await asyncio.to_thread(self._stop_threads)
        self.daemons.close()

    # --- flows -------------------------------------------------------------------------

    async def _load(self) -> None:
        """Once the daemons run: the pods from OVSDB and the flows found on the switch."""
        if self._adopted or not self.ports.running():
            return
        await self.ports.connect()
        for found in await self.ports.attached():
            key = f"{found.container_id}/{found.ifname}"
            ofport = await self.ports.ofport(found.host_ifname)
            if ofport > 0:
                self.state.pods[key] = LocalPod(key, ofport, found.address.ip, found.mac)
        self.state.adopted = parse_dump(await self.runner.dump_flows(t.BRIDGE))
        self._adopted = True

    async def _sync_flows(self, whole: bool = False) -> SyncResult | None:
        if self.state.node is None:
            return None
        if whole:
            self.flows.forget()
        return await self._within(
            "flow sync", self.flows.sync_groups(self.state.groups()), SETUP_TIMEOUT
        )

    async def _flow_problems(self, node: NodeNetwork) -> list[str]:
        known, self.state.node = self.state.node, node
        try:
            return await flow_problems(self.daemons, self.state.flows())
        finally:
            self.state.node = known

    async def _forget_pod(self, container_id: str, ifname: str, host: str) -> None:
        """Its flows first (one bundle), then its OVS port and its veth at once."""
        self.state.pods.pop(f"{container_id}/{ifname}", None)
        await self._sync_flows()
        await _together(self.ports.delete(host), self._pod("detach", lambda: ovspods.unwire(host)))

    def _free_ofport(self) -> int:
        """The lowest pod ofport no pod holds (chosen and taken without an await)."""
        used = {pod.ofport for pod in self.state.pods.values()}
        return next(
            n for n in range(t.FIRST_POD_PORT, t.FIRST_POD_PORT + len(used) + 1) if n not in used
        )

    # --- supervision -------------------------------------------------------------------

    def _supervise(self) -> None:
        if self._supervisor is None and not self._closed:
            self._supervisor = asyncio.create_task(self.daemons.supervise(self._restarted))

    async def _restarted(self, daemon: str) -> None:
        """``ovs-vswitchd`` came back without flows and with a new tun0 device: the host's
        side and every flow again. (A restarted ``ovsdb-server`` needs nothing.)"""
        node = self.state.node
        if daemon == OVSDB_SERVER or node is None:
            return
        log.warning("%s restarted: reprogramming the node", VSWITCHD)
        try:
            await self.ports.ensure(node)
            await self._node("reprogram", lambda nl: hostnet.ensure(nl, node, self.state.remotes))
            await self._sync_flows(whole=True)
            await self._within("peers", self.ports.peers(node, self.state.remotes or []))
        except DataPlaneError as err:
            log.error("reprogramming after the %s restart failed: %s", VSWITCHD, err)

    # --- plumbing ----------------------------------------------------------------------

    def _require(self, node: NodeNetwork | None) -> None:
        if self.state.node is None:
            raise DataPlaneError("the node is not set up (check_node or setup_node first)")
        if node is not None and node != self.state.node:
            raise DataPlaneError("the node's network changed: setup_node first")

    def _stop_threads(self) -> None:
        self._pod_threads.stop()
        self._kernel.close()

    async def _node(self, what: str, fn: Callable[[Netlink], T], limit: float | None = None) -> T:
        """``fn`` on the node thread, with its netlink socket."""
        return cast(T, await self._within(what, asyncio.shield(self._kernel(fn)), limit))

    async def _pod(self, what: str, fn: Callable[[], T]) -> T:
        """``fn`` on one of the pod threads."""
        return await self._within(what, asyncio.wrap_future(self._pod_threads.submit(fn)))

    async def _within(self, what: str, step: Awaitable[T], limit: float | None = None) -> T:
        """``step`` with a timeout, as a DataPlaneError (the work itself goes on)."""
        if self._closed:
            if asyncio.iscoroutine(step):
                step.close()
            raise DataPlaneError(f"{what}: the data plane is closed")
        limit = limit or self.timeout
        try:
            async with asyncio.timeout(limit):
                return await step
        except TimeoutError as err:
            raise DataPlaneError(f"{what} timed out after {limit:.0f} s") from err


async def _together(*steps: Awaitable[object]) -> None:
    """Run ``steps`` at once and let each finish; then raise the first one's error."""
    for outcome in await asyncio.gather(*steps, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome


def _never(host: str) -> PodAttachment:
    raise DataPlaneError(f"{host}: the identity written does not read back")


if TYPE_CHECKING:  # mypy checks that the class fulfils the contract
    from podnet.dataplane.interface import DataPlane

    _conforms: DataPlane = OvsDataPlane(Path())
