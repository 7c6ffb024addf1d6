"""Durations from the environment: positive and under a day, else the default."""

from __future__ import annotations

import pytest

from podnet.agent.heartbeat import lease_seconds_from_env
from podnet.controllers.nodelifecycle import grace_from_env
from podnet.envsettings import seconds_from_env


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("2.5", 2.5), ("40", 40.0), ("", 7.0), ("x", 7.0), ("0", 7.0), ("-3", 7.0), ("86400", 7.0)],
)
def test_seconds_from_env(monkeypatch: pytest.MonkeyPatch, raw: str, expected: float) -> None:
    monkeypatch.setenv("PODNET_TEST_SECONDS", raw)
    assert seconds_from_env("PODNET_TEST_SECONDS", 7.0) == expected


@pytest.mark.parametrize(("raw", "expected"), [("12", 12), ("1.5", 40), ("nope", 40), ("0", 40)])
def test_lease_seconds_are_whole(monkeypatch: pytest.MonkeyPatch, raw: str, expected: int) -> None:
    monkeypatch.setenv("PODNET_NODE_LEASE_SECONDS", raw)
    assert lease_seconds_from_env() == expected


def test_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PODNET_NODE_MONITOR_GRACE", "0.5")
    assert grace_from_env() == 0.5
    monkeypatch.delenv("PODNET_NODE_MONITOR_GRACE")
    assert grace_from_env() == 40.0
