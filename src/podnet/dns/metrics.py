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
  node's pod subnet, given nothing;

and, as CoreDNS's ``coredns_dns_requests_total``, ``coredns_dns_responses_total`` and
``coredns_cache_{hits,misses}_total`` count them (``podnet.dns.tally``):

- ``podnet_dns_requests_total{type}``: queries that reached the server (beyond the
  per-client limits) by query type (``A``, ``AAAA``, ``SRV``, ``PTR`` ... or ``other``);
- ``podnet_dns_responses_total{rcode}``: answers sent, by response code (``NOERROR``,
  ``NXDOMAIN``, ``SERVFAIL`` ... or ``other``);
- ``podnet_dns_cache_hits_total`` and ``podnet_dns_cache_misses_total``: queries
  answered from the answer cache, and the others;
- ``podnet_dns_upstream_failures_total{reason}``: the forwarder's failures
  (``podnet.dns.forwarder``: ``error``, ``servfail``, ``unanswered``, ``busy``,
  ``no_upstreams``).

Every label value comes from a fixed list: never a query name or a client address.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from podnet.dns.tally import Tally

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
        yield from answered(server.handler.tally, forwarder.failures)


def answered(tally: Tally, failures: Mapping[str, int]) -> Iterator[Metric]:
    """The families of ``tally`` and of the forwarder's ``failures``."""
    requests = CounterMetricFamily(
        "podnet_dns_requests", "DNS queries by query type", labels=["type"]
    )
    for kind, value in tally.requests().items():
        requests.add_metric([kind], value)
    yield requests
    responses = CounterMetricFamily(
        "podnet_dns_responses", "DNS answers sent by response code", labels=["rcode"]
    )
    for rcode, value in tally.responses().items():
        responses.add_metric([rcode], value)
    yield responses
    hits, misses = tally.cache()
    yield CounterMetricFamily(
        "podnet_dns_cache_hits", "DNS queries answered from the answer cache", value=hits
    )
    yield CounterMetricFamily(
        "podnet_dns_cache_misses", "DNS queries the answer cache could not answer", value=misses
    )
    upstream = CounterMetricFamily(
        "podnet_dns_upstream_failures", "Failures forwarding to upstreams", labels=["reason"]
    )
    for reason, value in failures.items():
        upstream.add_metric([reason], value)
    yield upstream
