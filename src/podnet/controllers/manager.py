"""The controller manager: leadership first, then the master's controllers in order.

One leadership term: make the ClusterNetwork agree with the configuration, make sure
Namespaces ``default`` and ``kube-node-lease`` exist, start the HostSubnet controller
(nodes wait for their subnets), then the NetNamespace controller (multitenant and
networkpolicy only), then namespace cleanup, then node lifecycle (Lease heartbeats),
then the endpoints controller (Endpoints and EndpointSlices of selector Services).
Each controller's ``start`` returns after its initial sync, and
``ready`` is True once all have. A controller that fails later is restarted alone, with
backoff, while the others keep running (``podnet.controllers.supervisor``). When
leadership is lost every controller is stopped before anything else happens and the
manager campaigns again: it never acts without holding leadership. A refused network
configuration ends ``run`` with ``ClusterNetworkError``; a controller that fails too
often in a row, or any other failure of the term, ends the term: the manager gives up
leadership and campaigns again after a backoff.

The controllers reach the objects only through a ``ControllerApi``: in the master the
in-process one (``podnet.controllers.inprocess``, leadership through etcd), in
``podnet controllers`` the HTTPS client (``podnet.controllers.process``, leadership
through a Lease object).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from podnet.client.backoff import Backoff
from podnet.controllers.base import Controller
from podnet.controllers.calls import ControllerApi
from podnet.controllers.clusternetwork import ClusterNetworkError, ensure_cluster_network
from podnet.controllers.config import NetworkConfig, uses_vnids
from podnet.controllers.endpoints import EndpointsController
from podnet.controllers.hostsubnets import HostSubnetController
from podnet.controllers.leader import AlwaysLeader, LeaderElector
from podnet.controllers.namespaces import NamespaceCleanupController, ensure_namespace
from podnet.controllers.netnamespaces import NetNamespaceController
from podnet.controllers.nodelifecycle import NodeLifecycleController
from podnet.controllers.supervisor import Supervisor
from podnet.controllers.workqueue import cancel_all
from podnet.model.schemas_coordination import NODE_LEASE_NAMESPACE

Obj = dict[str, Any]
TERM_BACKOFF = Backoff(1.0, 30.0)  # between failed leadership terms


class ControllerManager:
    """Runs the master's controllers while, and only while, this process leads."""

    def __init__(
        self,
        api: ControllerApi,
        config: NetworkConfig,
        elector: LeaderElector | None = None,
        log: logging.Logger | None = None,
        resync_period: float | None = 300.0,
        retry_backoff: Backoff = TERM_BACKOFF,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.api = api
        self.config = config
        self.elector: LeaderElector = elector or AlwaysLeader()
        self.log = log or logging.getLogger("podnet.controllers.manager")
        self.resync_period = resync_period
        self.cluster_network: Obj | None = None
        self._backoff = retry_backoff
        self.supervisor = supervisor or Supervisor(self.log)  # restarts a failed one alone
        self._started = False
        self._stopping = asyncio.Event()
        self._finished = asyncio.Event()
        self._running = False

    @property
    def ready(self) -> bool:
        """True while leading with every controller through its initial sync."""
        return self._started and all(c.ready for c in self.supervisor.controllers)

    @property
    def hostsubnets(self) -> HostSubnetController | None:
        """The running HostSubnet controller (a restart replaces it)."""
        running = self.supervisor.running("hostsubnets")
        return running if isinstance(running, HostSubnetController) else None

    @property
    def netnamespaces(self) -> NetNamespaceController | None:
        """The running NetNamespace controller (multitenant and networkpolicy only)."""
        running = self.supervisor.running("netnamespaces")
        return running if isinstance(running, NetNamespaceController) else None

    async def run(self) -> None:
        """Campaign, lead, and campaign again after a lost term, until ``stop``."""
        self._running = True
        failures = 0
        try:
            while not self._stopping.is_set():
                self.log.info("campaigning for leadership as %s", self.elector.identity)
                if not await self._unless_stopped(self.elector.acquire()):
                    break
                self.log.info("%s acquired leadership; starting controllers", self.elector.identity)
                failures = await self._term(failures)
        finally:
            await self._stop_controllers()
            await self.elector.release()
            self._running = False
            self._finished.set()
            self.log.info("controller manager stopped")

    async def stop(self) -> None:
        """Stop the controllers, give up leadership and end ``run``."""
        self._stopping.set()
        if self._running:
            await self._finished.wait()

    async def _unless_stopped(self, work: Awaitable[None]) -> bool:
        """Run ``work`` unless ``stop`` comes first; True when it finished."""
        task = asyncio.ensure_future(work)
        stopper = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            finished = task.done() and not task.cancelled()
            await cancel_all([task, stopper])
        if finished:
            task.result()
        return finished

    async def _term(self, failures: int) -> int:
        """One leadership term; returns the count of consecutive failed terms."""
        lead = asyncio.create_task(self._lead(), name="controller-manager-lead")
        lost = asyncio.create_task(self.elector.lost.wait())
        stopper = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({lead, lost, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when run() itself is cancelled: nothing may outlive the term
            error = lead.exception() if lead.done() and not lead.cancelled() else None
            await cancel_all([lead, lost, stopper])
            await self._stop_controllers()
        if isinstance(error, ClusterNetworkError):
            self.log.error("refusing to run: %s", error)
            raise error
        if error is not None:
            return await self._after_failure(error, failures)
        if self.elector.lost.is_set() and not self._stopping.is_set():
            self.log.warning("lost leadership; controllers stopped; campaigning again")
        return 0

    async def _after_failure(self, error: BaseException, failures: int) -> int:
        delay = self._backoff.delay(failures)
        self.log.error(
            "controllers failed: %s; giving up leadership, campaigning again in %.1fs",
            error,
            delay,
            exc_info=error,
        )
        await self.elector.release()
        await self._unless_stopped(asyncio.sleep(delay))
        return failures + 1

    async def _lead(self) -> None:
        self.cluster_network = await ensure_cluster_network(self.api, self.config)
        for namespace in ("default", NODE_LEASE_NAMESPACE):
            if await ensure_namespace(self.api, namespace):
                self.log.info("created namespace %s", namespace)
        for name, build in self._builders(self.cluster_network):
            await self.supervisor.start(name, build)
        self._started = True
        self.log.info("all controllers synced; ready")
        await self.supervisor.run()

    def _builders(self, cluster_network: Obj) -> list[tuple[str, Callable[[], Controller]]]:
        """Each controller of a term, in start order: its name and how to build it (the
        supervisor builds a fresh one for each restart)."""
        api, period = self.api, self.resync_period
        builders: list[tuple[str, Callable[[], Controller]]] = [
            ("hostsubnets", lambda: HostSubnetController(api, cluster_network, period))
        ]
        plugin = str(cluster_network.get("pluginName") or self.config.plugin_name)
        if uses_vnids(plugin):
            builders.append(("netnamespaces", lambda: NetNamespaceController(api, plugin, period)))
        builders += [
            ("namespace-cleanup", lambda: NamespaceCleanupController(api, period)),
            ("node-lifecycle", lambda: NodeLifecycleController(api)),
            ("endpoints", lambda: EndpointsController(api, resync_period=period)),
        ]
        return builders

    async def _stop_controllers(self) -> None:
        if not self.supervisor.slots:
            return
        self._started = False
        await self.supervisor.stop()
        self.log.info("controllers stopped")


async def run_or_stop_process(manager: ControllerManager, process: str) -> None:
    """Run ``manager``; if it fails (a refused configuration), log it and SIGTERM this
    process, whose signal handler stops it cleanly."""
    try:
        await manager.run()
    except asyncio.CancelledError:
        raise
    except Exception:
        manager.log.exception("controllers failed; %s stops", process)
        os.kill(os.getpid(), signal.SIGTERM)
