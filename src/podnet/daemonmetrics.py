"""What every podnet daemon's ``/metrics`` carries, whatever else it counts.

- ``process_*`` (prometheus-client's ``ProcessCollector``, read from ``/proc/self`` at
  scrape time on Linux): ``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
  ``process_open_fds``, ``process_max_fds``, ``process_start_time_seconds`` ...;
- ``podnet_build_info{version,python}``: always 1; the labels say which podnet and which
  Python run (two values fixed at start: the series count never grows).

Each daemon keeps its own ``CollectorRegistry`` (tests make many in one process), so these
are added to the registry the daemon serves, never to prometheus-client's global one.
"""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector

from podnet import __version__


def add_daemon_metrics(registry: CollectorRegistry) -> CollectorRegistry:
    """Register the process collector and the build-info gauge on ``registry``."""
    ProcessCollector(registry=registry)
    info = Gauge(
        "podnet_build_info",
        "Always 1; the labels say which podnet version and Python run this daemon",
        ["version", "python"],
        registry=registry,
    )
    info.labels(__version__, platform.python_version()).set(1)
    return registry
