"""The ``/metrics`` of ``podnet controllers`` (off unless ``--metrics-address``):

- ``process_*`` and ``podnet_build_info`` (``podnet.daemonmetrics``);
- ``podnet_controllers_leader``: 1 while this process leads (holds the Lease, its
  controllers through their first sync), else 0;
- ``podnet_controller_errors_total{controller}``: controller failures (a task that ended
  and restarts alone), by controller name (the manager's fixed set), as the master
  counts its in-process ones.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from podnet.daemonmetrics import add_daemon_metrics


class ControllersMetrics:
    """The registry above; ``leading`` is read at scrape time."""

    def __init__(self, leading: Callable[[], bool]) -> None:
        self.registry = add_daemon_metrics(CollectorRegistry())
        leader = Gauge(
            "podnet_controllers_leader",
            "1 while this process leads (holds the Lease, its controllers synced), else 0",
            registry=self.registry,
        )
        leader.set_function(lambda: float(leading()))
        self.errors = Counter(
            "podnet_controller_errors",
            "Controller failures (a task that ended; it restarts alone) by controller",
            ["controller"],
            registry=self.registry,
        )

    def failed(self, controller: str) -> None:
        """Count one failure of ``controller``."""
        self.errors.labels(controller).inc()

    def render(self) -> bytes:
        """The text exposition format, for ``/metrics``."""
        return generate_latest(self.registry)
