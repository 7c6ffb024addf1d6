"""Helpers the integration and e2e tests share: bounded polling and the cluster's state."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from podnet.cluster.state import ClusterState


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


def load_state(state_dir: Path) -> ClusterState:
    """The recorded state of the local cluster at ``state_dir`` (it must exist)."""
    state = ClusterState.load(state_dir)
    if state is None:
        raise RuntimeError(f"no cluster at {state_dir}")
    return state
