"""The agent's ``/metrics`` (Prometheus text format) on a TCP address of its choosing.

Off unless ``podnet node --metrics-address HOST:PORT`` is given (port 0 picks a free
one; ``port`` says which; ``podnet cluster up`` gives each agent 127.0.0.1 of its node
namespace). It serves the agent's registry (``agent_metrics``): ``process_*`` and
``podnet_build_info`` (``podnet.daemonmetrics``), the reconcile loops' counters
(``podnet.reconcile.metrics``), the CNI commands (``podnet.agent.cnimetrics``), the node
subnet's IPAM usage (``podnet.agent.ipammetrics``) and the cluster DNS's counters
(``podnet.dns.metrics``). The router serves its own registry on the same listener.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from podnet.agent.cnimetrics import CniMetrics
from podnet.agent.ipammetrics import IpamUsage
from podnet.daemonmetrics import add_daemon_metrics
from podnet.ipam.hostlocal import HostLocalStore
from podnet.reconcile import ReconcileMetrics

log = logging.getLogger("podnet.agent.metrics")


class Rendered(Protocol):
    """A registry's holder: its text exposition."""

    def render(self) -> bytes:
        """The Prometheus text format."""
        ...


def agent_metrics(store: HostLocalStore) -> tuple[ReconcileMetrics, CniMetrics, IpamUsage]:
    """The agent's registry (in its ``ReconcileMetrics``) with the CNI counters and the
    IPAM usage of ``store`` on it, and the process and build metrics of every daemon."""
    reconcile = ReconcileMetrics()
    add_daemon_metrics(reconcile.registry)
    ipam = IpamUsage(store)
    reconcile.registry.register(ipam)
    return reconcile, CniMetrics(reconcile.registry), ipam


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); ValueError if malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class MetricsServer:
    """``GET /metrics`` over HTTP; ``start``, then ``stop`` at shutdown."""

    def __init__(
        self,
        metrics: Rendered,
        address: str,
        refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``refresh``: awaited before each answer (figures read at scrape time)."""
        self.metrics = metrics
        self.refresh = refresh
        self.host, self.port = split_address(address)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Listen; ``port`` is the bound one afterwards."""
        app = web.Application()
        app.router.add_get("/metrics", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _serve(self, request: web.Request) -> web.Response:
        if self.refresh is not None:
            await self.refresh()
        return web.Response(body=self.metrics.render(), content_type="text/plain")
