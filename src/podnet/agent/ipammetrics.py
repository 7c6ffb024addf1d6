"""How full this node's pod subnet is, for the agent's ``/metrics``, read at scrape time.

- ``podnet_ipam_addresses_allocated``: addresses of the node subnet held in host-local
  IPAM (by a pod, or by a damaged reservation file: such an address is not handed out);
- ``podnet_ipam_addresses_capacity``: addresses of the node subnet that can go to pods
  (all but the network, gateway and broadcast addresses, as the CNI ``STATUS`` counts).

``refresh`` reads the store in a thread (it takes the IPAM lock) before each answer; the
collector yields the figures of the last read. Both are node-wide: no labels.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from ipaddress import IPv4Network

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from podnet.ipam.config import IpamError
from podnet.ipam.hostlocal import HostLocalStore

log = logging.getLogger("podnet.agent.metrics")

RESERVED = 3  # network, gateway (.1), broadcast


def subnet_capacity(subnet: IPv4Network) -> int:
    """Addresses of ``subnet`` that can go to pods."""
    return max(0, subnet.num_addresses - RESERVED)


def allocated_in(store: HostLocalStore, subnet: IPv4Network) -> int:
    """Addresses of ``subnet`` held in ``store`` (well-formed or damaged reservations)."""
    held = [ip for ip, _, _ in store.allocations()] + list(store.damaged())
    return sum(1 for ip in held if ip in subnet)


class IpamUsage(Collector):
    """The two gauges above for ``store``; nothing until the node's subnet is known."""

    def __init__(self, store: HostLocalStore) -> None:
        self.store = store
        self.subnet: IPv4Network | None = None
        self.allocated = 0

    async def refresh(self) -> None:
        """Count the allocations now; a failed read keeps the last count."""
        if self.subnet is None:
            return
        try:
            self.allocated = await asyncio.to_thread(allocated_in, self.store, self.subnet)
        except (OSError, IpamError) as exc:
            log.warning("reading IPAM allocations for /metrics failed: %s", exc)

    def collect(self) -> Iterator[Metric]:
        """The gauges, once the subnet is known."""
        if self.subnet is None:
            return
        yield GaugeMetricFamily(
            "podnet_ipam_addresses_allocated",
            "Addresses of the node's pod subnet held in IPAM",
            value=self.allocated,
        )
        yield GaugeMetricFamily(
            "podnet_ipam_addresses_capacity",
            "Addresses of the node's pod subnet that can go to pods",
            value=subnet_capacity(self.subnet),
        )
