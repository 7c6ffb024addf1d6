"""The cluster DNS's counters in the agent's ``/metrics``, read at scrape time.

The DNS thread keeps plain integers (no lock, no registry call per query); this
collector reads them when ``/metrics`` is asked:

- ``podnet_dns_client_limited_total{limit}``: what a per-client limit refused:
  ``qps`` and ``uncached_qps`` (queries beyond a token bucket: dropped over UDP,
  delayed over TCP),
  ``tcp_connections`` (connections closed at accept), ``forwards`` (queries answered
  REFUSED because the client had too many waiting on upstreams);
- ``podnet_dns_dropped_total``: queries or answers dropped at a server-wide bound;
- ``podnet_dns_foreign_sources_total``: queries and connections from outside the
  node's pod subnet, given nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from podnet.dns.sync import ClusterDns


class DnsCollector(Collector):
    """The counters above, of one ``ClusterDns``."""

    def __init__(self, dns: ClusterDns) -> None:
        self.dns = dns

    def collect(self) -> Iterator[Metric]:
        """One family per counter (see the module docstring)."""
        server, forwarder = self.dns.server, self.dns.forwarder
        limited = CounterMetricFamily(
            "podnet_dns_client_limited",
            "DNS queries or connections refused by a per-client limit",
            labels=["limit"],
        )
        limited.add_metric(["qps"], server.buckets.limited)
        limited.add_metric(["uncached_qps"], server.uncached.limited)
        limited.add_metric(["tcp_connections"], server.tcp_slots.refused)
        limited.add_metric(["forwards"], forwarder.clients.refused)
        yield limited
        yield CounterMetricFamily(
            "podnet_dns_dropped",
            "DNS queries or answers dropped at a server-wide bound",
            value=server.dropped,
        )
        yield CounterMetricFamily(
            "podnet_dns_foreign_sources",
            "DNS queries and connections from outside the pod subnet",
            value=server.allowed.refused,
        )
