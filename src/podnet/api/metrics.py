"""Prometheus metrics of the API server, on a registry of its own (one per server)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


@dataclass
class ApiMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.requests = Counter(
            "podnet_apiserver_requests",
            "API requests by verb, resource and code",
            ["verb", "resource", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "podnet_apiserver_request_duration_seconds",
            "API request latency",
            ["verb", "resource"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.watchers = Gauge(
            "podnet_apiserver_watchers",
            "Open watch streams",
            ["resource"],
            registry=self.registry,
        )
        self.watch_events = Counter(
            "podnet_apiserver_watch_events",
            "Events sent to watchers",
            ["resource"],
            registry=self.registry,
        )
        self.watches_expired = Counter(
            "podnet_apiserver_watches_expired",
            "Watches told 410 Expired before or during their replay: why is too_old (a "
            "revision older than the watch cache's history) or over_budget (more to "
            "replay than a watcher's backlog bound)",
            ["resource", "why"],
            registry=self.registry,
        )
        self.watch_dispatch = Histogram(
            "podnet_apiserver_watch_dispatch_seconds",
            "From a change reaching the watch cache to its bytes handed to every watcher",
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.controller_errors = Counter(
            "podnet_controller_errors",
            "Controller failures (a task that ended; it restarts alone) by controller",
            ["controller"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
