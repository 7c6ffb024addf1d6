"""Every daemon's registry carries process_* and podnet_build_info (podnet.daemonmetrics):
the master's (with its leader gauge and etcd timings), the router's and the agent's, each
read through its text exposition as a scrape reads it."""

from __future__ import annotations

import platform
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from podnet import __version__
from podnet.agent.metrics import agent_metrics
from podnet.controllers.config import NetworkConfig
from podnet.daemonmetrics import add_daemon_metrics
from podnet.ipam.hostlocal import HostLocalStore
from podnet.master import Master, MasterOptions
from podnet.router.metrics import ReloadFigures, RouteCounts, RouteKey, RouterMetrics
from podnet.testing.metricstext import sample


def assert_daemon_metrics(text: bytes) -> None:
    """The process figures are real (this process's) and the build info is 1."""
    assert (sample(text, "process_cpu_seconds_total") or 0) > 0
    assert (sample(text, "process_resident_memory_bytes") or 0) > 10 * 1024 * 1024
    assert (sample(text, "process_open_fds") or 0) >= 3
    assert (sample(text, "process_start_time_seconds") or 0) > 1.6e9
    python = platform.python_version()
    assert sample(text, "podnet_build_info", version=__version__, python=python) == 1.0


def test_the_shared_piece_on_a_registry_of_its_own() -> None:
    registry = add_daemon_metrics(CollectorRegistry())
    assert_daemon_metrics(generate_latest(registry))


def test_master_serves_process_build_leader_and_etcd_metrics(tmp_path: Path) -> None:
    master = Master(MasterOptions(NetworkConfig.default(), state_dir=tmp_path / "master"))
    text = master.metrics.render()
    assert_daemon_metrics(text)
    assert sample(text, "podnet_master_leader") == 0.0  # no controllers: not leading
    for operation in ("Range", "Txn", "Compact", "watch"):
        count = "podnet_etcd_request_duration_seconds_count"
        assert sample(text, count, operation=operation) == 0.0
    assert master.store.metrics is not None  # the store it calls etcd with times them


async def _no_routes() -> dict[RouteKey, RouteCounts]:
    return {}


def test_router_serves_process_and_build_metrics() -> None:
    metrics = RouterMetrics(_no_routes, ReloadFigures)
    assert_daemon_metrics(metrics.reconcile.render())


def test_agent_serves_process_and_build_metrics(tmp_path: Path) -> None:
    reconcile, _, _ = agent_metrics(HostLocalStore(tmp_path, "podnet"))
    assert_daemon_metrics(reconcile.render())
