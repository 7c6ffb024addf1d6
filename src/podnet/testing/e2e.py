"""Helpers the tests share: bounded polling (blocking and asyncio), the cluster's state,
and the data plane the local clusters of the e2e suites run (``TEST_DATAPLANE``)."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from podnet import netns
from podnet.cluster import lifecycle, nodes
from podnet.cluster.state import CLUSTER_DATAPLANES, ClusterState


def _test_dataplane() -> str:
    name = os.environ.get("PODNET_TEST_DATAPLANE", "linux")
    if name not in CLUSTER_DATAPLANES:
        raise RuntimeError(
            f"PODNET_TEST_DATAPLANE={name!r}: one of {', '.join(CLUSTER_DATAPLANES)}"
        )
    return name


# The one switch of the e2e suites: every local cluster they start runs this data plane
# (PODNET_TEST_DATAPLANE=ovs runs the same tests on Open vSwitch; default linux).
TEST_DATAPLANE = _test_dataplane()


def wait_for(
    check: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.2,
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``check`` until it returns something truthy, and return that; an exception of
    a type in ``ignore`` counts as "not yet". Bounded by ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except ignore:
            value = None
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def eventually(
    check: Callable[[], Any], timeout: float = 10.0, what: str = "condition", interval: float = 0.01
) -> Any:
    """The asyncio face of ``wait_for``: poll ``check`` (a function, or one returning an
    awaitable) until its value is truthy, and return that. Bounded by ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


class Lines:
    """The lines a running process writes to a pipe, collected by a thread as they come,
    so that a test waits for a line (a readiness signal) instead of sleeping."""

    def __init__(self, pipe: IO[str]) -> None:
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._reader.start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout: float = 30.0) -> str:
        """The first line containing ``needle``, once it has come (bounded by ``timeout``)."""
        return str(
            wait_for(
                lambda: next((line for line in list(self.lines) if needle in line), None),
                timeout,
                f"a line with {needle!r}",
                interval=0.05,
            )
        )

    def finish(self, timeout: float = 10.0) -> list[str]:
        """Every line, once the pipe has closed (the process ended)."""
        self._reader.join(timeout)
        return list(self.lines)


class Ping:
    """``ping`` from namespace ``ns``, its lines read as they come: ``flowing`` waits for
    the first reply (the readiness signal before a disruption), ``finish`` for the end."""

    def __init__(self, ns: str, dst: str, count: int, interval: float) -> None:
        argv = ["ping", "-n", "-i", str(interval), "-c", str(count), "-W", "1", dst]
        self.process = subprocess.Popen(netns.command(ns, argv), stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.lines = Lines(self.process.stdout)

    def flowing(self, timeout: float = 30.0) -> None:
        self.lines.wait_for("bytes from", timeout)

    def running(self) -> bool:
        return self.process.poll() is None

    def finish(self, timeout: float = 90.0) -> str:
        """Everything ping printed (its summary last); killed if it outlives ``timeout``."""
        try:
            self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(5)
        return "\n".join(self.lines.finish())


def load_state(state_dir: Path) -> ClusterState:
    """The recorded state of the local cluster at ``state_dir`` (it must exist)."""
    state = ClusterState.load(state_dir)
    if state is None:
        raise RuntimeError(f"no cluster at {state_dir}")
    return state


def cluster_down_with_logs(state_dir: Path) -> ClusterState | None:
    """Print the tail of each agent's log (pytest shows it for a failed test), tear the
    local cluster at ``state_dir`` down, and give back the state it had."""
    state = ClusterState.load(state_dir)
    for name in state.nodes if state else ():
        log = nodes.node_paths(state_dir, name).agent_log
        print(f"--- {log} (tail)\n{nodes.log_tail(log, 15)}")
    lifecycle.cluster_down(state_dir, say=print)
    return state
