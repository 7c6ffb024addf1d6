"""``LinuxDataPlane``: the DataPlane contract on a Linux bridge, VXLAN/host-gw and nftables.

Namespace rule: a ``LinuxDataPlane`` works in the network namespace of the thread that
*constructed* it. The constructor starts one worker thread, which inherits that
namespace; every netlink request, sysctl write and ``nft`` run happens on that thread,
off the event loop, one at a time (a pyroute2 socket is not thread-safe, and a serial
order keeps check-then-change steps consistent). Pod namespaces are entered by the
worker only long enough to open a socket there. Every call has a timeout (a kernel call
that hangs keeps the worker busy, so the calls queued behind it time out too).

    with podnet.netns.entered("node-1"):   # or: already running inside the node
        plane = LinuxDataPlane()
    await plane.setup_node(node)
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
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
from podnet.dataplane.linux.netlink import Netlink
from podnet.dataplane.linux.nftables import PodPortSet

T = TypeVar("T")
CALL_TIMEOUT = 10.0
SETUP_TIMEOUT = 60.0


def _namespace_id() -> int:
    return os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net").st_ino


class NamespaceWorker:
    """One thread that runs submitted functions, in the namespace it was started in."""

    def __init__(self, name: str) -> None:
        self.namespace = _namespace_id()
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn``; its result (or exception) arrives in the returned future."""
        future: Future[T] = Future()
        self._queue.put((fn, future))
        return future

    def stop(self, timeout: float = 5.0) -> None:
        """Finish queued work, then end the thread."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        if _namespace_id() != self.namespace:  # cannot happen: threads inherit it
            raise RuntimeError("worker thread started outside its namespace")
        while (item := self._queue.get()) is not None:
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as err:
                future.set_exception(err)


class LinuxDataPlane:
    """The ``linux`` backend (see the module docstring for the namespace rule)."""

    def __init__(self, *, timeout: float = CALL_TIMEOUT) -> None:
        self.timeout = timeout
        self.namespace = _namespace_id()
        self._worker = NamespaceWorker(f"podnet-dataplane-{self.namespace}")
        self._netlink: Netlink | None = None
        self._ports: PodPortSet | None = None
        self._bridge: int | None = None  # br0's index, cached for attach_pod
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
        problems = await self._call("check_node", lambda: node_setup.check(self._nl(), node))
        return DataPlaneStatus(ok=not problems, problems=problems)

    async def setup_node(self, node: NodeNetwork) -> None:
        """Build or repair ``node``'s set-up, touching only what differs."""
        self._bridge = None
        await self._call(
            "setup_node", lambda: node_setup.setup(self._nl(), node), timeout=SETUP_TIMEOUT
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
        return await self._call("attach_pod", lambda: self._attach(pod))

    async def detach_pod(self, container_id: str, ifname: str, netns: str | None) -> None:
        """Undo ``attach_pod``; fine if parts or all of it are gone. ``netns`` is not
        needed: deleting the host end removes the peer wherever it is."""
        await self._call(
            "detach_pod", lambda: pods.detach(self._nl(), self._port_set(), container_id, ifname)
        )

    async def attached_pods(self) -> list[PodAttachment]:
        """The pods wired on this node, from the kernel."""
        return await self._call("attached_pods", lambda: pods.attached(self._nl()))

    async def close(self) -> None:
        """Close the sockets and stop the worker thread (later calls fail)."""
        if self._closed:
            return
        try:
            await self._call("close", self._close_netlink)
        finally:
            self._closed = True
            await asyncio.to_thread(self._worker.stop)

    # --- plumbing --------------------------------------------------------------------

    def _nl(self) -> Netlink:
        """The node socket; opened lazily, on the worker thread."""
        if self._netlink is None:
            self._netlink = Netlink.open()
        return self._netlink

    def _port_set(self) -> PodPortSet:
        """The anti-spoofing set's nfnetlink socket; opened lazily, on the worker."""
        if self._ports is None:
            self._ports = PodPortSet()
        return self._ports

    def _attach(self, pod: PodNetwork) -> PodAttachment:
        nl = self._nl()
        bridge = self._bridge or pods.bridge_index(nl)
        try:
            result = pods.attach(nl, self._port_set(), pod, bridge)
        except DataPlaneError:
            self._bridge = None  # maybe br0 was rebuilt: look it up again next time
            raise
        self._bridge = bridge
        return result

    def _close_netlink(self) -> None:
        if self._netlink is not None:
            self._netlink.close()
            self._netlink = None
        if self._ports is not None:
            self._ports.close()
            self._ports = None

    async def _call(self, what: str, fn: Callable[[], T], *, timeout: float | None = None) -> T:
        if self._closed:
            raise DataPlaneError(f"{what}: the data plane is closed")
        limit = timeout or self.timeout

        def timed() -> T:
            started = time.perf_counter()
            try:
                return fn()
            finally:
                self.timings[what] = (time.perf_counter() - started) * 1000

        future = asyncio.wrap_future(self._worker.submit(timed))
        try:
            return await asyncio.wait_for(future, limit)
        except TimeoutError as err:
            raise DataPlaneError(f"{what} timed out after {limit:.0f} s") from err


if TYPE_CHECKING:  # mypy checks that the class fulfils the contract
    _conforms: DataPlane = LinuxDataPlane()
