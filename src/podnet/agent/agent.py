"""``NodeAgent``: the start order of an OpenShift SDN node, then watching and resyncing.

Start order (each step logs what it does):

1. Register the Node (``status.addresses`` InternalIP through the status subresource),
   retrying until the master answers; publish its underlay MAC on it (``underlaymac``).
2. Wait for this node's HostSubnet ("waiting for HostSubnet for node X" every few seconds)
   and read ClusterNetwork ``default``, each through a watch of that one object, not a poll.
3. ``check_node``: if the data plane matches, leave it running ("data plane in place; not
   touching it"); otherwise ``setup_node``.
4. Reconcile pods: half-done attachments and orphaned IPAM files are undone; healthy pods stay.
5. Install the CNI plugin and ``10-podnet.conflist`` (rewritten only when it changes).
6. Serve CNI on the unix socket, renew the node's Lease (``heartbeat``, for ever from
   here on), then mark the Node ``Ready``.
7. Watch HostSubnets (remote nodes) and ClusterNetwork (``clusterwatch``), what isolation
   and NetworkPolicy read (``policies.PolicySync``), Services and EndpointSlices for the
   proxy (``services.ServiceSync``), EgressNetworkPolicies (``egress.EgressSync``); serve
   the cluster DNS (``podnet.dns.sync.ClusterDns``, unless ``--no-dns``; a thread of its
   own, per-client limits, counters in ``/metrics``); resync periodically. All share one
   list + watch per kind (``client.informers``). The loops are ``podnet.reconcile``
   loops: their last passes are the Node's annotation ``podnet.io/reconcile``
   (``nodestatus``) and counted in ``/metrics`` (``--metrics-address``).

Stopping (SIGTERM/SIGINT) stops serving and exits without tearing anything down: pods
keep running, and a SIGKILL is just as safe since all state is in the kernel and IPAM.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import gc
import logging
import sys
from collections.abc import Awaitable, Callable
from ipaddress import IPv4Address
from typing import Any

from podnet.agent import egress as egress_firewall
from podnet.agent.clusterwatch import CLUSTER_NETWORK_NAME, ClusterWatch
from podnet.agent.cniplugin import conflist, install_plugin_once
from podnet.agent.cniserver import CniServer, claim_socket_path
from podnet.agent.config import (
    AgentConfig,
    cluster_network_problem,
    dns_settings,
    hostsubnet_problem,
    node_network,
)
from podnet.agent.events import NodeEvents
from podnet.agent.heartbeat import NodeHeartbeat
from podnet.agent.metrics import MetricsServer, agent_metrics
from podnet.agent.nodestatus import node_addresses, node_object, reconcile_note, with_condition
from podnet.agent.objectwait import wait_for_object
from podnet.agent.podlifecycle import PodLifecycle, node_pods
from podnet.agent.pods import PodManager
from podnet.agent.podstatus import PodStatusWriter
from podnet.agent.policies import PolicySync, network_plugin
from podnet.agent.remotes import RemoteNodeSync, remote_nodes
from podnet.agent.services import ServiceSync, pacing
from podnet.agent.underlaymac import publish_underlay_mac
from podnet.client import Backoff, ClientError, has_reason, is_transient, with_retry
from podnet.client.aio import AsyncApiClient
from podnet.client.informers import Informers
from podnet.dataplane.interface import (
    DataPlane,
    DataPlaneError,
    DataPlaneRejected,
    NodeNetwork,
    NodeSetupRefused,
)
from podnet.dns.metrics import DnsCollector
from podnet.dns.sync import ClusterDns
from podnet.files import write_if_changed
from podnet.ipam.hostlocal import HostLocalStore
from podnet.model.kinds import CLUSTER_NETWORK, HOST_SUBNET, NODE, Kind

log = logging.getLogger("podnet.agent")

Obj = dict[str, Any]
SHUTDOWN_FLUSH_SECONDS = 5.0
WATCHER_BACKOFF = Backoff(0.2, 3.0, floor=0.0)  # a watcher that failed is restarted soon


def freeze_startup_objects() -> None:
    """Take what start-up made (~60,000 objects: modules, clients) out of the garbage
    collector's way. A full collection over them stops every thread for ~30 ms, which
    showed as CNI ADD latency outliers; afterwards one covers only newer objects."""
    gc.collect()
    gc.freeze()


def _retry_write(exc: BaseException) -> bool:
    return is_transient(exc) or has_reason(exc, "Conflict", "AlreadyExists")


def _retry_dataplane(exc: BaseException) -> bool:
    return isinstance(exc, DataPlaneError) and not isinstance(exc, DataPlaneRejected)


class NodeAgent:
    """One node's agent: ``run`` until ``stop`` is set, then leave the data plane be."""

    def __init__(
        self,
        config: AgentConfig,
        dataplane: DataPlane,
        api: AsyncApiClient,
        node_ip: IPv4Address,
        python: str = sys.executable,
    ) -> None:
        self.config = config
        self.dataplane = dataplane
        self.api = api
        self.node_ip = node_ip
        self.python = python
        self.store = HostLocalStore(config.ipam_dir, config.network_name)
        self.node: NodeNetwork | None = None
        self.pods: PodManager | None = None
        self.server: CniServer | None = None
        self.status_writer = PodStatusWriter(api, config.node_name, node_ip)
        self.events = NodeEvents(api, config.node_name)
        self.heartbeat = NodeHeartbeat(api, config.node_name)
        self.remote_sync: RemoteNodeSync | None = None
        self.policy_sync: PolicySync | None = None
        self.service_sync: ServiceSync | None = None
        self.dns: ClusterDns | None = None
        self.informers = Informers(api)  # one shared list + watch per kind for every loop
        self.metrics, self.cni_metrics, self.ipam_usage = agent_metrics(self.store)
        self.note = reconcile_note(api, config.node_name)  # the loops' last passes
        address, refresh = config.metrics_address, self.ipam_usage.refresh
        self.metrics_server = MetricsServer(self.metrics, address, refresh) if address else None
        self.plugin = ""  # ClusterNetwork pluginName, read at start
        self.serving = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self, stop: asyncio.Event) -> None:
        """Start (abandoned if ``stop`` comes first), serve until ``stop``, shut down."""
        starting = asyncio.create_task(self.start(), name="start")
        stopping = asyncio.create_task(stop.wait(), name="stop")
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done():
                starting.result()  # a failed start raises here
                await stopping
        finally:
            for task in (starting, stopping):
                task.cancel()
            await asyncio.gather(starting, stopping, return_exceptions=True)
            await self.shutdown()

    async def start(self) -> None:
        """Steps 1-7 of the module docstring (after making sure no other agent serves)."""
        name = self.config.node_name
        claim_socket_path(self.config.socket_path)  # refuse before touching anything
        self.config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        await self.register_node()
        hostsubnet = await self._wait_for(HOST_SUBNET, name, hostsubnet_problem)
        network = await self._wait_for(
            CLUSTER_NETWORK, CLUSTER_NETWORK_NAME, cluster_network_problem
        )
        node = node_network(self.config, self.node_ip, hostsubnet, network)
        self.node = node
        self.plugin = network_plugin(network)
        log.info(
            "node %s: subnet %s, gateway %s, mtu %d, %s, %s",
            name,
            node.subnet,
            node.gateway,
            node.mtu,
            node.tunnel,
            self.plugin,
        )
        await with_retry(
            lambda: self.ensure_dataplane(node),
            "data plane set-up",
            120.0,
            retry_if=_retry_dataplane,
        )
        await self.sync_remote_nodes_once(node)
        await self.start_pods(node)
        await self.install_cni_plugin(node)
        await self.start_serving()
        await self.start_watchers(node)
        await self.start_heartbeat()
        await self.set_ready()
        freeze_startup_objects()
        log.info("node %s ready", name)

    async def sync_remote_nodes_once(self, node: NodeNetwork) -> None:
        """Route to the nodes known now, before serving; host-gw refuses to start here
        when a node is not on this node's L2 segment (NodeSetupRefused ends the agent)."""
        listing = await with_retry(lambda: self.api.list(HOST_SUBNET), "listing HostSubnets", 60.0)
        remotes = remote_nodes(listing.items, self.config.node_name)
        try:
            await with_retry(
                lambda: self.dataplane.sync_remote_nodes(node, remotes),
                "routing to remote nodes",
                60.0,
                retry_if=_retry_dataplane,
            )
        except DataPlaneRejected as exc:
            if isinstance(exc, NodeSetupRefused):
                raise
            log.error("routing to remote nodes refused (%s); the remote-node loop follows", exc)
            return
        log.info("routes to %d remote nodes in place", len(remotes))

    async def register_node(self) -> None:
        """Create this Node, or bring its addresses up to date (status subresource)."""
        what = f"registering node {self.config.node_name}"
        await with_retry(self._register_once, what, None, Backoff(0.2, 5.0), _retry_write)
        await publish_underlay_mac(self.api, self.config.node_name, self.node_ip)

    async def _register_once(self) -> None:
        name = self.config.node_name
        if await self.api.get_or_none(NODE, None, name) is None:
            await self.api.create(NODE, node_object(name, self.node_ip))
            log.info("registered node %s with InternalIP %s", name, self.node_ip)
            return
        addresses = node_addresses(name, self.node_ip)
        await self.update_node_status(lambda status: {**status, "addresses": addresses})
        log.info("node %s exists; InternalIP %s", name, self.node_ip)

    async def update_node_status(self, mutate: Callable[[Obj], Obj]) -> None:
        """Read-modify-write of this Node's status; no write when nothing changes."""

        async def once() -> None:
            node = await self.api.get(NODE, None, self.config.node_name)
            status = node.get("status") or {}
            new = mutate(copy.deepcopy(status))
            if new != status:
                await self.api.update_status(NODE, {**node, "status": new})

        await with_retry(once, "updating node status", 60.0, retry_if=_retry_write)

    async def set_ready(self) -> None:
        """Mark the Node Ready: the agent serves CNI requests."""
        message = "podnet node agent is serving CNI requests"
        await self.update_node_status(
            lambda status: with_condition(status, "Ready", "True", "PodnetReady", message)
        )

    async def start_heartbeat(self) -> None:
        """Renew the Lease once (so the master sees this node alive before it is Ready
        again), then keep renewing it in the background."""
        try:
            await self.heartbeat.renew()
        except ClientError as exc:
            log.warning("first Lease renewal failed: %s; retrying in the background", exc)
        self._tasks.append(asyncio.create_task(self.heartbeat.run(), name="heartbeat"))

    async def _wait_for(
        self, kind: Kind, name: str, problem: Callable[[Obj | None, IPv4Address], str | None]
    ) -> Obj:
        """Watch ``kind/name`` until ``problem`` finds nothing wrong; log the wait."""
        return await wait_for_object(
            self.api, kind, name, lambda obj: problem(obj, self.node_ip), self.config.node_name
        )

    async def ensure_dataplane(self, node: NodeNetwork, quiet: bool = False) -> bool:
        """``check_node``; ``setup_node`` only when the check fails. True if it set up."""
        status = await self.dataplane.check_node(node)
        if status.ok:
            log.log(
                logging.DEBUG if quiet else logging.INFO, "data plane in place; not touching it"
            )
            return False
        level = logging.WARNING if quiet else logging.INFO
        log.log(level, "data plane needs set-up (%s); setting up", "; ".join(status.problems))
        await self.dataplane.setup_node(node)
        log.info("data plane set up for %s", node.version_note())
        return True

    async def start_pods(self, node: NodeNetwork) -> None:
        """Re-attach/GC pods after a restart, then accept CNI work."""
        self.pods = node_pods(
            self.config, self.dataplane, self.store, node, self.status_writer, self.events
        )
        await self.pods.reconcile()
        self.pods.ready = True
        self.ipam_usage.subnet = node.subnet  # /metrics: the subnet's usage from here on

    async def install_cni_plugin(self, node: NodeNetwork) -> None:
        """The shim in the CNI bin dir and the conflist (written only when it changed)."""
        stamp = self.config.state_dir / "cni-plugin.stamp"
        plugin, installed = await asyncio.to_thread(
            install_plugin_once, self.config.cni_bin_dir, self.python, stamp
        )
        log.info("CNI plugin %s at %s", "installed" if installed else "up to date", plugin)
        path = self.config.conflist_path
        written = await asyncio.to_thread(write_if_changed, path, conflist(self.config, node.mtu))
        log.info("CNI config %s %s", path, "written" if written else "unchanged")

    async def start_serving(self) -> None:
        """Open the CNI socket."""
        assert self.pods is not None
        self.server = CniServer(self.config.socket_path, self.pods, self.cni_metrics)
        await self.server.start()
        self.serving.set()

    async def start_watchers(self, node: NodeNetwork) -> None:
        """HostSubnets -> remote nodes, policy rules, ClusterNetwork changes, resync, the
        reconcile note and /metrics."""
        resync, metrics, report = self.config.resync_period, self.metrics, self.note.record
        assert self.pods is not None  # finalizes Pods, tears orphans down (podlifecycle)
        lifecycle = PodLifecycle(self.informers, self.pods, self.api, metrics.registry)
        for name, body in lifecycle.tasks():
            self._spawn(name, body)
        self.remote_sync = RemoteNodeSync(
            self.dataplane, node, resync, metrics=metrics, report=report
        )
        self._spawn("remote-sync", self.remote_sync.run)
        self.policy_sync = PolicySync(
            self.informers,
            self.dataplane,
            node,
            self.plugin,
            resync,
            status_path=self.config.state_dir / "policy.json",
            metrics=metrics,
            report=report,
        )
        for name, body in self.policy_sync.tasks():
            self._spawn(name, body)
        loop = {"metrics": metrics, "report": report}
        services = ServiceSync(self.informers, self.dataplane, node, pacing(resync), **loop)
        self.service_sync = services  # the egress firewall (podnet.agent.egress) beside it
        egress = egress_firewall.EgressSync(
            self.informers, self.dataplane, node, egress_firewall.pacing(resync), **loop
        )
        egress.plugin = lambda: self.plugin  # the subnet plugin firewalls nothing
        for name, body in [*services.tasks(), *egress.tasks()]:
            self._spawn(name, body)
        if self.config.dns:
            settings = dns_settings(self.config)
            # first listings indexed after the proxy's first apply: they share the GIL
            self.dns = ClusterDns(self.informers, node, settings, after=services.synced)
            metrics.registry.register(DnsCollector(self.dns))
            for name, body in self.dns.tasks():
                self._spawn(name, body)
        watch = ClusterWatch(self.informers, self.config, self.node_ip, node)
        self._spawn(
            "watch-hostsubnets", functools.partial(watch.watch_hostsubnets, self.remote_sync)
        )
        self._spawn(
            "watch-clusternetwork", functools.partial(watch.watch_cluster_network, self.policy_sync)
        )
        self._spawn("resync", self._resync_forever)
        self._spawn("reconcile-note", self.note.run)
        if self.metrics_server is not None:
            await self.metrics_server.start()

    def _spawn(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        self._tasks.append(asyncio.create_task(self._supervise(name, body), name=name))

    async def _supervise(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        attempt = 0
        while True:
            try:
                await body()
            except ClientError as exc:
                log.error("%s failed: %s; restarting it", name, exc)
            except Exception:
                log.exception("%s failed; restarting it", name)
            await asyncio.sleep(WATCHER_BACKOFF.delay(attempt))
            attempt += 1

    async def _resync_forever(self) -> None:
        """Repair drift of the node's own set-up; the remote and policy syncs repair theirs."""
        assert self.node is not None and self.remote_sync and self.policy_sync
        while True:
            await asyncio.sleep(self.config.resync_period)
            try:
                if await self.ensure_dataplane(self.node, quiet=True):
                    self.remote_sync.poke()
                    self.policy_sync.poke()
                    if self.service_sync is not None:
                        self.service_sync.poke()
            except DataPlaneError as exc:
                log.error("resync of the node set-up failed: %s", exc)

    async def shutdown(self) -> None:
        """Stop serving and watching; leave the data plane and pods as they are."""
        if self.server is not None:
            await self.server.stop()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.informers.close()
        await self.status_writer.flush(SHUTDOWN_FLUSH_SECONDS)
        await self.status_writer.close()
        await self.events.close()
        await self.dataplane.close()
        await self.api.close()
        gc.unfreeze()
        log.info("stopped; the data plane and pods are left running")
