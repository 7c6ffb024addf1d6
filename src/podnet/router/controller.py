"""The router's controller: Routes, Services and EndpointSlices in, HAProxy and
``status.ingress`` out.

``RouterController`` watches the three kinds cluster-wide (one shared reflector each,
``podnet.client.informers``) into ``RouterInputs`` and is the target of a
``podnet.reconcile`` loop, the agent's loop:

- nothing is applied before every kind has listed; a burst of changes is coalesced
  (``COALESCE_SECONDS``), then the step admits the routes (``admission``: the oldest
  route wins a host and path) and builds the ``RouterTable`` of the admitted ones
  (``compile.RouterCompiler``, in a worker thread), and the driver applies it; an equal
  table changes nothing in HAProxy;
- a table HAProxy refuses (``haproxy -c`` or the reload: a certificate it cannot load) is
  bisected by route with check-only probes (``driver.check``: the live HAProxy keeps
  serving the last table meanwhile); the routes at fault are left out, the rest is
  served, and the left-out routes are marked not admitted (``ExtendedValidationFailed``,
  HAProxy's words as the message);
- after each pass the routes' Admitted conditions for this router go to
  ``RouteStatusWriter``, which writes only those that differ from what the route's
  status says; an event that changes only a route's status is checked against the last
  verdict without a new pass (someone else's write is corrected, ours is not repeated).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from podnet.client import BOOKMARK, LISTED, WatchEvent
from podnet.dataplane.interface import DataPlaneError, DataPlaneRejected
from podnet.model.kinds import ENDPOINT_SLICE, ROUTE, SERVICE, Kind
from podnet.reconcile import ApplyRecord, Pacing, ReconcileLoop
from podnet.router.admission import route_key
from podnet.router.compile import Desired, RouterCompiler, final_verdicts
from podnet.router.haproxy import ConfigRejected, DriverCounters
from podnet.router.haproxy.master import ReloadFailed
from podnet.router.haproxy.runtimeapi import RuntimeAPIError
from podnet.router.inputs import SPEC, STATUS, RouterInputs
from podnet.router.metrics import RouterMetrics
from podnet.router.routestatus import RouteStatusWriter
from podnet.router.table import RouterTable

log = logging.getLogger("podnet.router")

COALESCE_SECONDS = 0.005  # a burst of changes is taken together
CUT_RETRY_SECONDS = 1.0  # serving a bisection's cut failed: a new pass after this long
KINDS: tuple[Kind, ...] = (ROUTE, SERVICE, ENDPOINT_SLICE)


class Driver(Protocol):
    """What the controller needs of the HAProxy layer (``HAProxyRouter``)."""

    async def start(self, table: RouterTable) -> None:
        """Start HAProxy serving ``table``, or adopt a running one and reload it;
        ``ConfigRejected`` when HAProxy refuses the table."""
        ...

    @property
    def counters(self) -> DriverCounters:
        """Reloads, refusals (``rejected``) and the last error so far."""
        ...

    @property
    def live_table(self) -> RouterTable | None:
        """The table HAProxy serves now."""
        ...

    async def check(self, table: RouterTable) -> None:
        """Render ``table`` and have HAProxy check it without serving it;
        ``ConfigRejected`` when refused."""
        ...

    def update(self, table: RouterTable) -> int:
        """Ask for ``table`` to be served (coalesced); its update number."""
        ...

    async def settled(self, update: int | None = None) -> DriverCounters:
        """Until update ``update`` is applied or refused."""
        ...


class WatchSource(Protocol):
    """``Informers.watch``: LISTED, then every change, for ever."""

    def watch(self, kind: Kind) -> Any: ...


class RouterController:
    """Keeps HAProxy equal to the admitted routes, and their status to the verdicts."""

    name = "router"

    def __init__(
        self,
        api: WatchSource,
        driver: Driver,
        statuses: RouteStatusWriter,
        metrics: RouterMetrics,
        router_name: str,
        resync_period: float = 300.0,
    ) -> None:
        self.api, self.driver, self.statuses = api, driver, statuses
        self.metrics, self.router_name = metrics, router_name
        self.inputs = RouterInputs()
        self.compiler = RouterCompiler()  # used by the loop's worker thread, one pass at a time
        self.served: Desired | None = None  # the last state applied (whole or cut)
        self.started = False  # HAProxy starts with the first table, once all have listed
        pacing = Pacing(resync_period, COALESCE_SECONDS, compile_in_thread=True)
        self.loop: ReconcileLoop[Desired] = ReconcileLoop(
            self, pacing, inputs=[k.plural for k in KINDS], metrics=metrics.reconcile
        )
        self.synced = self.loop.synced

    def tasks(self) -> list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]]:
        """(name, coroutine function) to run: the loop and one watch per kind."""
        watches = [(f"router-watch-{k.plural}", functools.partial(self.watch, k)) for k in KINDS]
        return [("router-sync", self.loop.run), *watches]

    async def watch(self, kind: Kind) -> None:
        """Keep one kind's events; the informer relists on expiry."""
        async for event in self.api.watch(kind):
            self.on_event(kind, event)

    def on_event(self, kind: Kind, event: WatchEvent) -> None:
        """One watch event: a pass when routing may change, a status check when only a
        route's status did."""
        if event.type == BOOKMARK:
            return
        change = self.inputs.take(kind.plural, event)
        if change == SPEC:
            if event.type == LISTED:
                self.loop.listed(kind.plural)
            else:
                self.loop.changed()
        elif change == STATUS:
            self.statuses.check(self.inputs.routes, route_key(event.object))

    # ---- the reconcile target ------------------------------------------------------------

    def take(self) -> Callable[[], Desired]:
        """The step that computes the desired state from a snapshot of the inputs."""
        return functools.partial(self.compiler.compute, self.inputs.snapshot())

    async def apply(self, desired: Desired) -> None:
        """Serve ``desired``'s table; a bisection probe (a cut) is only checked. HAProxy
        refusing a table is the loop's permanent error (bisection follows); any other
        failure a transient one."""
        if not desired.probe:
            await self._serve(desired.table)
            return
        try:
            await self.driver.check(desired.table)
        except ConfigRejected as exc:
            raise DataPlaneRejected(str(exc)) from exc
        except OSError as exc:
            raise DataPlaneError(f"checking a table: {exc}") from exc

    async def _serve(self, table: RouterTable) -> None:
        """Hand ``table`` to HAProxy and wait until it serves it; the first one starts
        HAProxy (or reloads the one a killed router left serving its routes)."""
        if not self.started:
            await self._start(table)
            return
        refused = self.driver.counters.rejected
        counters = await self.driver.settled(self.driver.update(table))
        if counters.rejected > refused:
            self.metrics.render_errors.inc()
            raise DataPlaneRejected(counters.last_error or "HAProxy refused the configuration")
        if self.driver.live_table != table:
            raise DataPlaneError(counters.last_error or "HAProxy did not take the table")

    async def _start(self, table: RouterTable) -> None:
        try:
            await self.driver.start(table)
        except ConfigRejected as exc:
            self.metrics.render_errors.inc()
            raise DataPlaneRejected(str(exc)) from exc
        except (ReloadFailed, RuntimeAPIError, OSError) as exc:  # HAProxy died or is busy
            raise DataPlaneError(f"starting HAProxy: {exc}") from exc
        self.started = True
        log.info("HAProxy started with %d routes", len(table.routes))

    async def _serve_cut(self, table: RouterTable) -> bool:
        """Serve a bisection's cut; on failure try again with a new pass, later."""
        if self.driver.live_table == table:
            return True
        try:
            await self._serve(table)
        except DataPlaneError as exc:
            log.error("router: serving the routes HAProxy takes failed: %s", exc)
            asyncio.get_running_loop().call_later(CUT_RETRY_SECONDS, self.loop.poke)
            return False
        return True

    def keys(self, desired: Desired) -> Sequence[str]:
        """Routes by ``namespace:name``."""
        return [route.key for route in desired.table.routes]

    def without(self, desired: Desired, left_out: frozenset[str]) -> Desired:
        return desired.without(left_out)

    def describe(self, desired: Desired) -> str:
        servers = sum(len(r.servers) for r in desired.table.routes)
        return f"{len(desired.table.routes)} routes, {servers} servers"

    async def after_apply(self, desired: Desired, record: ApplyRecord) -> None:
        """Serve the cut a bisection found (its probes were only checked); log a new
        table; hand the verdicts to the status writer."""
        left_out = frozenset(record.left_out)
        if left_out:
            if not await self._serve_cut(desired.served_without(left_out)):
                return
            self.compiler.refuse(left_out, record.error)  # next pass: admitted without them
            self.loop.poke()
        verdicts = final_verdicts(desired, left_out, record.error)
        if self.served is None or desired.table != self.served.table:
            log.info("router %s: serving %s (%s)", self.router_name, record.what, record.result)
        self.served = desired
        admitted = sum(1 for v in verdicts.values() if v.admitted)
        self.metrics.route_states(admitted, len(verdicts) - admitted)
        self.statuses.sync(self.inputs.routes, verdicts)
