"""``podnet controllers --metrics-address``: its /metrics carries process_*,
podnet_build_info, its leader gauge and its controllers' failures; a malformed address
is refused before anything runs; off by default."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from podnet.controllers.config import NetworkConfig
from podnet.controllers.process import ControllersOptions, ControllersProcess
from podnet.testing.metricstext import sample


def options(tmp_path: Path, address: str | None) -> ControllersOptions:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    # an API nobody serves: the manager keeps retrying; /metrics answers meanwhile
    server = "https://127.0.0.1:9"
    return ControllersOptions(NetworkConfig.default(), server, token, metrics_address=address)


async def test_metrics_of_the_controllers_process(tmp_path: Path) -> None:
    process = ControllersProcess(options(tmp_path, "127.0.0.1:0"))
    await process.start()
    try:
        assert process.metrics_server is not None
        process.metrics.failed("hostsubnets")  # as the supervisor reports one
        url = f"http://127.0.0.1:{process.metrics_server.port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            assert resp.status == 200
            text = await resp.text()
    finally:
        await process.stop()
    assert (sample(text, "process_resident_memory_bytes") or 0) > 0
    assert (sample(text, "process_open_fds") or 0) > 0
    assert sample(text, "podnet_build_info") == 1.0
    assert sample(text, "podnet_controllers_leader") == 0.0
    assert sample(text, "podnet_controller_errors_total", controller="hostsubnets") == 1.0
    assert process.manager.supervisor.on_failure == process.metrics.failed


def test_a_malformed_address_is_refused_and_none_serves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        ControllersProcess(options(tmp_path, "0.0.0.0"))
    assert ControllersProcess(options(tmp_path, None)).metrics_server is None
