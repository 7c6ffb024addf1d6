"""The router's Prometheus metrics, and the ``/metrics`` listener that serves them.

- ``podnet_router_route_requests_total{namespace,route}`` and
  ``podnet_router_route_errors_total{namespace,route}``: read from HAProxy's ``show stat``
  at scrape time, through the driver, which carries them across reloads
  (``podnet.router.haproxy.stats``);
- ``podnet_router_reloads_total`` and ``podnet_router_last_reload_seconds`` (how long the
  last reload took): from the HAProxy driver, at scrape time;
- ``podnet_router_routes{state}``: routes ``admitted`` and ``rejected`` by this router;
- ``podnet_router_render_errors_total``: tables HAProxy refused (the route at fault is
  then left out and marked not admitted);
- the router loop's ``podnet_reconcile_*`` (``podnet.reconcile.metrics``);
- ``process_*`` and ``podnet_build_info`` (``podnet.daemonmetrics``).

The listener is the agent's (``podnet.agent.metrics.MetricsServer``) with a refresh of
the HAProxy figures before each answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from podnet.daemonmetrics import add_daemon_metrics
from podnet.reconcile import ReconcileMetrics

log = logging.getLogger("podnet.router.metrics")

RouteKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class RouteCounts:
    """What HAProxy counted for one route's backend since its worker started."""

    requests: int = 0
    errors: int = 0


@dataclass(frozen=True)
class ReloadFigures:
    """The driver's reload count and the duration of its last reload (seconds)."""

    reloads: int = 0
    last_reload_seconds: float = 0.0


class HAProxyCollector(Collector):
    """Yields the last figures read from HAProxy (``RouterMetrics.refresh`` reads them)."""

    def __init__(self) -> None:
        self.routes: dict[RouteKey, RouteCounts] = {}
        self.reload = ReloadFigures()

    def collect(self) -> Iterator[Metric]:
        labels = ["namespace", "route"]
        requests = CounterMetricFamily(
            "podnet_router_route_requests", "Requests (TCP sessions for passthrough) per route",
            labels=labels,
        )  # fmt: skip
        errors = CounterMetricFamily(
            "podnet_router_route_errors",
            "Failed requests per route: 5xx answers, connection and response errors",
            labels=labels,
        )
        for (namespace, name), counts in sorted(self.routes.items()):
            requests.add_metric([namespace, name], counts.requests)
            errors.add_metric([namespace, name], counts.errors)
        yield requests
        yield errors
        yield CounterMetricFamily(
            "podnet_router_reloads", "HAProxy reloads", value=self.reload.reloads
        )
        yield GaugeMetricFamily(
            "podnet_router_last_reload_seconds",
            "How long the last HAProxy reload took",
            value=self.reload.last_reload_seconds,
        )


class RouterMetrics:
    """The router's registry: the loop's counters, route states, HAProxy's figures."""

    def __init__(
        self,
        read_routes: Callable[[], Awaitable[Mapping[RouteKey, RouteCounts]]],
        read_reloads: Callable[[], ReloadFigures],
    ) -> None:
        self.registry = add_daemon_metrics(CollectorRegistry())  # process_*, build info
        self.reconcile = ReconcileMetrics(self.registry)
        self.routes = Gauge(
            "podnet_router_routes", "Routes by admission state", ["state"], registry=self.registry
        )
        self.render_errors = Counter(
            "podnet_router_render_errors", "Tables HAProxy refused", registry=self.registry
        )
        self.haproxy = HAProxyCollector()
        self.registry.register(self.haproxy)
        self._read_routes, self._read_reloads = read_routes, read_reloads

    def route_states(self, admitted: int, rejected: int) -> None:
        """Set how many routes this router admitted and rejected."""
        self.routes.labels("admitted").set(admitted)
        self.routes.labels("rejected").set(rejected)

    async def refresh(self) -> None:
        """Read HAProxy's figures now (before an answer); a failed read keeps the last."""
        self.haproxy.reload = self._read_reloads()
        try:
            read = await self._read_routes()
        except Exception as exc:  # the runtime API's errors, a worker gone: try next time
            log.warning("reading HAProxy's statistics failed: %s", exc)
            return
        self.haproxy.routes = dict(read)
