"""The agent's ``/metrics`` (Prometheus text format) on a TCP address of its choosing.

Off unless ``podnet node --metrics-address HOST:PORT`` is given (port 0 picks a free
one; ``port`` says which). It serves the agent's registry: today the reconcile loops'
counters (``podnet.reconcile.metrics``), among them the permanent errors and the
objects left out of the data plane.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from podnet.reconcile import ReconcileMetrics

log = logging.getLogger("podnet.agent.metrics")


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
        metrics: ReconcileMetrics,
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
