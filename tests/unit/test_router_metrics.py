"""The router's metrics (``podnet.router.metrics``): counters read from HAProxy at scrape
time, carried across reloads, served on ``/metrics``."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from podnet.agent.metrics import MetricsServer
from podnet.router.metrics import (
    ReloadFigures,
    RouteCounts,
    RouteKey,
    RouterMetrics,
)

WEB: RouteKey = ("shop", "web")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def test_metrics_endpoint_reads_haproxy_at_each_scrape() -> None:
    reads = [{WEB: RouteCounts(7, 2)}, {WEB: RouteCounts(10, 2)}]
    reloads = ReloadFigures(4, 0.25)

    async def read_routes() -> dict[RouteKey, RouteCounts]:
        return reads.pop(0)

    metrics = RouterMetrics(read_routes, lambda: reloads)
    metrics.route_states(admitted=3, rejected=1)
    metrics.render_errors.inc()
    server = MetricsServer(metrics.reconcile, "127.0.0.1:0", refresh=metrics.refresh)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        async with aiohttp.ClientSession() as session:
            first = samples(await (await session.get(url)).text())
            second = samples(await (await session.get(url)).text())
    finally:
        await server.stop()
    route = (("namespace", "shop"), ("route", "web"))
    assert first[("podnet_router_route_requests_total", route)] == 7
    assert first[("podnet_router_route_errors_total", route)] == 2
    assert second[("podnet_router_route_requests_total", route)] == 10
    assert second[("podnet_router_route_errors_total", route)] == 2
    assert second[("podnet_router_reloads_total", ())] == 4
    assert second[("podnet_router_last_reload_seconds", ())] == 0.25
    assert second[("podnet_router_routes", (("state", "admitted"),))] == 3
    assert second[("podnet_router_routes", (("state", "rejected"),))] == 1
    assert second[("podnet_router_render_errors_total", ())] == 1


async def test_a_failed_read_keeps_the_last_figures() -> None:
    answers: list[dict[RouteKey, RouteCounts] | OSError] = [
        {WEB: RouteCounts(7, 2)},
        OSError("gone"),
    ]

    async def read_routes() -> dict[RouteKey, RouteCounts]:
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    metrics = RouterMetrics(read_routes, ReloadFigures)
    await metrics.refresh()
    await metrics.refresh()
    assert metrics.haproxy.routes == {WEB: RouteCounts(7, 2)}
