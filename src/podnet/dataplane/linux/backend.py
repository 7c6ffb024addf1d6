"""``LinuxDataPlane``: the DataPlane contract on a Linux bridge, VXLAN/host-gw and nftables.

Namespace rule: a ``LinuxDataPlane`` works in the network namespace of the thread that
*constructed* it. The constructor starts its worker threads (``workers``), which inherit
that namespace; every netlink request, sysctl write and ``nft`` run happens on them, off
the event loop. One thread does the node's own set-up, remote nodes and listings, in
order (a pyroute2 socket is not thread-safe, and a serial order keeps check-then-change
steps consistent); a few more wire pods, each with its own sockets, so independent pods
are attached and detached in parallel. Operations on one pod are serial, and node
check/set-up never overlaps pod wiring (``SharedExclusive``). Pod namespaces are entered
by a worker only long enough to open a socket there. Every call has a timeout (a kernel
call that hangs keeps its thread busy; the calls queued behind it time out too).

    with podnet.netns.entered("node-1"):   # or: already running inside the node
        plane = LinuxDataPlane()
    await plane.setup_node(node)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from podnet.dataplane.interface import (
    DataPlane,
    DataPlaneError,
    DataPlaneStatus,
    NodeNetwork,
    PodAttachment,
    PodNetwork,
    RemoteNode,
)
from podnet.dataplane.linux import node as node_setup
from podnet.dataplane.linux import pods
from podnet.dataplane.linux.desired import PodPort, host_veth_name
from podnet.dataplane.linux.egressnft import EgressFirewallNft
from podnet.dataplane.linux.netlink import Netlink
from podnet.dataplane.linux.pods import PodSockets
from podnet.dataplane.linux.policy import PolicyTableSync
from podnet.dataplane.linux.policytable import PolicyRenderer
from podnet.dataplane.linux.rtnl import LinkDeletion
from podnet.dataplane.linux.services import ServiceTableSync
from podnet.dataplane.linux.workers import (
    KeyedLocks,
    NamespaceWorker,
    SharedExclusive,
    namespace_id,
)
from podnet.egress.nodetable import NodeFirewall
from podnet.policy.model import RuleSet
from podnet.services.model import ServiceTable

T = TypeVar("T")
CALL_TIMEOUT = 10.0
SETUP_TIMEOUT = 60.0
POD_THREADS = 8  # a detach holds one for ~20 ms after it returns (see detach_pod)
SHARED, EXCLUSIVE = False, True
Release = Callable[[], None]


class LinuxDataPlane:
    """The ``linux`` backend (see the module docstring for the namespace rule)."""

    def __init__(self, *, timeout: float = CALL_TIMEOUT, pod_threads: int = POD_THREADS) -> None:
        self.timeout = timeout
        self.namespace = namespace_id()
        self._worker = NamespaceWorker(f"podnet-dataplane-{self.namespace}")
        self._pod_workers = NamespaceWorker(f"podnet-pods-{self.namespace}", pod_threads)
        self._order = SharedExclusive()  # pod wiring shared, node check/set-up exclusive
        self._pod_locks = KeyedLocks()
        self._netlink: Netlink | None = None  # the node thread's pyroute2 socket
        self._local = threading.local()  # each pod thread's PodSockets
        self._pod_sockets: list[PodSockets] = []
        self._pod_sockets_lock = threading.Lock()
        self._bridge: int | None = None  # br0's index, cached for attach_pod
        self._known: dict[str, PodPort] = {}  # host veth -> its anti-spoofing entry
        self._renderer: PolicyRenderer | None = None  # used on the node thread only
        self._policy = PolicyTableSync()
        self.services = ServiceTableSync()
        self.egress = EgressFirewallNft()  # the host's, as the service proxy
        self.timings: dict[str, float] = {}  # last duration of each operation, ms
        self._closed = False

    @classmethod
    async def create(cls, *, timeout: float = CALL_TIMEOUT) -> LinuxDataPlane:
        """Construct in the current thread's namespace and open the netlink socket."""
        plane = cls(timeout=timeout)
        await plane._call("open", plane._nl)
        return plane

    # --- the DataPlane contract ----------------------------------------------------

    async def check_node(self, node: NodeNetwork) -> DataPlaneStatus:
        """Compare the kernel with ``node``'s set-up; change nothing."""
        problems = await self._call(
            "check_node", lambda: node_setup.check(self._nl(), node), hold=EXCLUSIVE
        )
        return DataPlaneStatus(ok=not problems, problems=problems)

    async def setup_node(self, node: NodeNetwork) -> None:
        """Build or repair ``node``'s set-up, touching only what differs."""
        self._bridge = None
        await self._call(
            "setup_node",
            lambda: node_setup.setup(self._nl(), node),
            hold=EXCLUSIVE,
            timeout=SETUP_TIMEOUT,
        )

    async def sync_remote_nodes(self, node: NodeNetwork, remotes: list[RemoteNode]) -> None:
        """Make routes/neighbours/FDB match ``remotes`` exactly (only the difference)."""
        remotes = list(remotes)
        await self._call(
            "sync_remote_nodes",
            lambda: node_setup.sync_remotes(self._nl(), node, remotes),
            timeout=SETUP_TIMEOUT,
        )

    async def attach_pod(self, pod: PodNetwork) -> PodAttachment:
        """Wire one pod interface (veth born in the pod netns, address, routes, MAC,
        MTU, anti-spoofing entry)."""
        host = host_veth_name(pod.container_id, pod.ifname)
        bridge = self._bridge
        if bridge is None:
            bridge = await self._call("bridge", lambda: pods.bridge_index(self._nl()))
        try:
            attached = await self._call(
                "attach_pod", lambda: pods.attach(self._sockets(), pod, bridge), pod=host
            )
        except DataPlaneError:
            self._bridge = None  # maybe br0 was rebuilt: look it up again next time
            raise
        self._bridge = bridge
        self._known[host] = PodPort.of(attached)
        return attached

    async def detach_pod(self, container_id: str, ifname: str, netns: str | None) -> None:
        """Undo ``attach_pod``; fine if parts or all of it are gone. ``netns`` is not
        needed: deleting the host end removes the peer wherever it is. Returns as soon
        as the veth is gone; the kernel's clean-up after that (~20 ms) goes on on a pod
        thread, and this pod's next operation waits for it."""
        host = host_veth_name(container_id, ifname)
        known = self._known.get(host) or await self._call(
            "known_port", lambda: pods.known_port(self._nl(), container_id, ifname)
        )
        await self._within("detach_pod", self._detach(host, known))
        self._known.pop(host, None)

    async def attached_pods(self) -> list[PodAttachment]:
        """The pods wired on this node, from the kernel."""
        found = await self._call("attached_pods", lambda: pods.attached(self._nl()))
        self._known.update((a.host_ifname, PodPort.of(a)) for a in found)
        return found

    async def sync_policy(self, node: NodeNetwork, rules: RuleSet) -> None:
        """Render ``rules`` for this node and apply the difference in one nft transaction
        (rendering too runs on the node thread, off the event loop)."""

        def sync() -> bool:
            if self._renderer is None or self._renderer.node_name != node.node_name:
                self._renderer = PolicyRenderer(node.node_name)
            return self._policy.sync(self._renderer.render(rules))

        await self._call("sync_policy", sync, timeout=SETUP_TIMEOUT)

    async def sync_services(self, node: NodeNetwork, table: ServiceTable) -> None:
        """Render ``table`` and apply the difference in one nft transaction (none when
        nothing differs); flush UDP conntrack entries of removed endpoints."""
        await self._call(
            "sync_services", lambda: self.services.sync(node, table), timeout=SETUP_TIMEOUT
        )

    async def sync_egress_firewall(self, node: NodeNetwork, firewall: NodeFirewall) -> None:
        """``table inet podnet_egress`` (``podnet.dataplane.linux.egressnft``)."""
        await self._call(
            "sync_egress_firewall", lambda: self.egress.sync(node, firewall), timeout=SETUP_TIMEOUT
        )

    async def close(self) -> None:
        """Close the sockets and stop the worker threads (later calls fail)."""
        if self._closed:
            return
        try:
            await self._call("close", self._close_netlink)
        finally:
            self._closed = True
            await asyncio.to_thread(self._stop_workers)

    # --- plumbing --------------------------------------------------------------------

    def _nl(self) -> Netlink:
        """The node socket; opened lazily, on the node thread."""
        if self._netlink is None:
            self._netlink = Netlink.open()
        return self._netlink

    def _sockets(self) -> PodSockets:
        """The calling pod thread's sockets; opened lazily, on that thread."""
        sockets: PodSockets | None = getattr(self._local, "sockets", None)
        if sockets is None:
            sockets = self._local.sockets = PodSockets()
            with self._pod_sockets_lock:
                self._pod_sockets.append(sockets)
        return sockets

    def _close_netlink(self) -> None:
        self.services.close()
        if self._netlink is not None:
            self._netlink.close()
            self._netlink = None

    def _stop_workers(self) -> None:
        self._pod_workers.stop()
        self._worker.stop()
        with self._pod_sockets_lock:
            for sockets in self._pod_sockets:
                sockets.close()
            self._pod_sockets.clear()

    async def _detach(self, host: str, known: PodPort | None) -> None:
        """Drop the entry and start the veth deletion on a pod thread; return when the
        kernel reports the veth gone (or the thread fails first)."""
        loop = asyncio.get_running_loop()
        handed: asyncio.Future[LinkDeletion] = loop.create_future()

        def work() -> None:
            deletion = pods.start_detach(self._sockets(), host, known)
            loop.call_soon_threadsafe(_hand_over, handed, deletion)
            try:
                deletion.send()
            finally:
                deletion.done_with()

        releases = await self._hold(host, SHARED)
        working = self._submit("detach_pod", work, True, releases)
        deletion = await _first_step(handed, working)
        reading = asyncio.ensure_future(deletion.gone())
        try:
            either: list[asyncio.Future[Any]] = [reading, working]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not reading.done() and working.exception() is not None:
                working.result()  # the send failed: no answer will come
            await reading
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)  # off the loop's fd list
            deletion.done_with()

    async def _within(self, what: str, step: Awaitable[T], limit: float | None = None) -> T:
        """``step`` with the call timeout, as a DataPlaneError."""
        limit = limit or self.timeout
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                return await step
        except TimeoutError as err:
            if not deadline.expired():
                raise
            raise DataPlaneError(f"{what} timed out after {limit:.0f} s") from err

    async def _call(
        self,
        what: str,
        fn: Callable[[], T],
        *,
        pod: str | None = None,
        hold: bool | None = None,
        timeout: float | None = None,
    ) -> T:
        """Run ``fn`` on a pod thread (``pod``: that pod's host veth, its operations
        serial) or on the node thread, holding ``_order`` shared for pods or as ``hold``
        says. The holds last until ``fn`` ends, even past a timeout."""

        async def step() -> T:
            releases = await self._hold(pod, SHARED if pod else hold)
            return await asyncio.shield(self._submit(what, fn, pod is not None, releases))

        return await self._within(what, step(), timeout)

    async def _hold(self, pod: str | None, hold: bool | None) -> list[Release]:
        releases: list[Release] = []
        try:
            if pod is not None:
                await self._pod_locks.acquire(pod)
                releases.append(lambda: self._pod_locks.release(pod))
            if hold is not None:
                await self._order.acquire(hold)
                releases.append(lambda: self._order.release(hold))
        except BaseException:
            _run_all(releases)
            raise
        return releases

    def _submit(
        self, what: str, fn: Callable[[], T], on_pod_thread: bool, releases: list[Release]
    ) -> asyncio.Future[T]:
        def timed() -> T:
            started = time.perf_counter()
            try:
                return fn()
            finally:
                self.timings[what] = (time.perf_counter() - started) * 1000

        worker = self._pod_workers if on_pod_thread else self._worker
        try:
            if self._closed:
                raise DataPlaneError(f"{what}: the data plane is closed")
            future = asyncio.wrap_future(worker.submit(timed))
        except BaseException:
            _run_all(releases)
            raise
        future.add_done_callback(lambda done: _finished(done, releases))
        return future


async def _first_step(
    handed: asyncio.Future[LinkDeletion], working: asyncio.Future[None]
) -> LinkDeletion:
    """The deletion handed over by ``working``; its error if it failed before that."""
    either: list[asyncio.Future[Any]] = [handed, working]
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        _abandon(handed)
        raise
    if not handed.done():  # hand-overs run on the loop before the work's own result
        _abandon(handed)
        working.result()
        raise DataPlaneError("detach_pod ended without deleting the veth")
    return handed.result()


def _abandon(handed: asyncio.Future[LinkDeletion]) -> None:
    """Nobody will read the deletion: let its sender close it alone."""
    if handed.done() and not handed.cancelled():
        handed.result().done_with()
    handed.cancel()


def _hand_over(handed: asyncio.Future[LinkDeletion], deletion: LinkDeletion) -> None:
    if handed.cancelled():
        deletion.done_with()  # nobody waits: the sender closes it
    else:
        handed.set_result(deletion)


def _finished(future: asyncio.Future[T], releases: list[Release]) -> None:
    """Give the holds up; mark the outcome seen (a caller that timed out never reads it)."""
    if not future.cancelled():
        future.exception()
    _run_all(releases)


def _run_all(releases: list[Release]) -> None:
    for release in reversed(releases):
        release()


if TYPE_CHECKING:  # mypy checks that the class fulfils the contract
    _conforms: DataPlane = LinuxDataPlane()
