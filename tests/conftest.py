"""Shared fixtures: a real etcd per test worker, and real master processes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from podnet.store.etcd_process import EtcdProcess, start_etcd
from podnet.testing import tools
from podnet.testing.processes import MasterProcess, launch_master
from podnet.testing.routerns import RouterNamespace, router_namespace


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """One etcd for this test worker, on free loopback ports; removed even on failure."""
    tools.require("etcd")
    process = start_etcd(tmp_path_factory.mktemp("etcd"))
    try:
        yield process
    finally:
        process.stop(remove_data=True)


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses, so tests share one etcd without meeting."""
    return f"/podnet-test-{uuid.uuid4().hex[:12]}/"


@pytest.fixture
def master(etcd: EtcdProcess, tmp_path: Path, prefix: str) -> Iterator[MasterProcess]:
    """A real ``podnet master`` (subnet plugin) on its own port and prefix."""
    process = launch_master(etcd, tmp_path / "master", prefix, "--network-plugin", "multitenant")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def router_lab(master: MasterProcess, tmp_path: Path) -> Iterator[RouterNamespace]:
    """``podnet router``'s test namespace beside ``master`` (``podnet.testing.routerns``)."""
    with router_namespace(master, tmp_path) as made:
        yield made


@pytest.fixture
def kubeconfig_env(master: MasterProcess, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KUBECONFIG", str(master.kubeconfig))
    return master.kubeconfig


@pytest.fixture(scope="session")
def kubectl() -> str:
    """The real kubectl (>= 1.28). A missing or old one fails the test, never skips it."""
    return tools.require("kubectl", tools.KUBECTL_MIN)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Kernel tests (marked ``root``) fail, never skip, without root, nft, ip or ping;
    before any of their fixtures runs, so the reason is this and not a fixture's error."""
    if item.get_closest_marker("root"):
        tools.require_root()
        for tool in ("nft", "ip", "ping"):
            tools.require(tool)


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("PODNET_TEST_RUN", uuid.uuid4().hex[:8])


# The modules that take longest, longest first. ``scripts/test.sh`` hands modules to its
# workers in collection order (``--dist loadfile --no-loadscope-reorder``; xdist's default
# order, by number of tests, put these one-test modules last, and the run then ended with
# the chaos test alone on one worker for minutes). The rest keep pytest's order: e2e,
# integration, then the many short unit modules that fill the workers at the end.
LONGEST_FIRST = (
    "tests/e2e/test_chaos.py",
    "tests/integration/test_api_fuzz_schemathesis.py",
    "tests/integration/test_cni_fuzz.py",
    "tests/e2e/test_real_hosts_guide.py",
    "tests/e2e/test_policy_e2e.py",
    "tests/e2e/test_runtime.py",
    "tests/e2e/test_services_e2e.py",
    "tests/integration/test_node_crash_safety.py",
    "tests/integration/test_watch_replay_herd.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the modules of ``LONGEST_FIRST`` first, in its order (a stable sort)."""
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
