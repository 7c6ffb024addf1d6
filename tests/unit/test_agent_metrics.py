"""The agent's ``/metrics`` listener: what it serves, and what it refuses.

It is the one TCP listener ``podnet node`` adds (off unless ``--metrics-address``), and it
has no authentication, so it must be read-only and say nothing but counts per loop.
"""

from __future__ import annotations

import aiohttp
import pytest

from podnet.agent.metrics import MetricsServer, split_address
from podnet.reconcile import ReconcileMetrics


@pytest.mark.parametrize(
    ("address", "expected"),
    [("127.0.0.1:9101", ("127.0.0.1", 9101)), ("[::1]:0", ("::1", 0))],
)
def test_split_address(address: str, expected: tuple[str, int]) -> None:
    assert split_address(address) == expected


@pytest.mark.parametrize("address", ["127.0.0.1", ":80", "host:", "host:http", "h:65536"])
def test_split_address_refuses_malformed(address: str) -> None:
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        split_address(address)


async def test_metrics_are_read_only_counts() -> None:
    metrics = ReconcileMetrics()
    metrics.refused("policy")
    server = MetricsServer(metrics, "127.0.0.1:0")
    await server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/metrics") as resp:
                assert resp.status == 200
                body = await resp.text()
            assert 'podnet_reconcile_permanent_errors_total{loop="policy"} 1.0' in body
            for method in ("POST", "PUT", "DELETE", "PATCH"):
                async with session.request(method, f"{base}/metrics", data=b"x") as resp:
                    assert resp.status == 405, method
            for path in ("/", "/metrics/../etc/passwd", "/debug", "/healthz"):
                async with session.get(f"{base}{path}") as resp:
                    assert resp.status == 404, path
        after = metrics.render().decode()
        assert 'podnet_reconcile_permanent_errors_total{loop="policy"} 1.0' in after
    finally:
        await server.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as session:
            await session.get(f"{base}/metrics")
