"""``podnet node``'s per-client DNS flags: they reach the agent's configuration, and a
bad combination is refused with a clear error before the agent starts."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from podnet.agent.config import AgentConfig
from podnet.cli import node_cmd
from podnet.dns.ratelimit import ClientLimits


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[AgentConfig]:
    """The configurations the command would have run the agent with."""
    found: list[AgentConfig] = []

    async def run(config: AgentConfig, dataplane: str) -> None:
        found.append(config)

    monkeypatch.setattr(node_cmd, "_run", run)
    return found


def invoke(*flags: str) -> Any:
    argv = ["--node-ip", "192.0.2.10", "--dataplane", "fake", *flags]
    return CliRunner().invoke(node_cmd.node, argv, obj=None)


def test_the_flags_reach_the_agents_config(started: list[AgentConfig]) -> None:
    done = invoke(
        "--dns-client-qps=800",
        "--dns-client-uncached-qps=40",
        "--dns-client-tcp-connections=3",
        "--dns-client-forwards=5",
    )
    assert done.exit_code == 0, done.output
    assert started[0].dns_client_limits == ClientLimits(800, 40, 3, 5)


def test_the_defaults(started: list[AgentConfig]) -> None:
    assert invoke().exit_code == 0
    assert started[0].dns_client_limits == ClientLimits()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--dns-client-qps=100", "--dns-client-uncached-qps=200"), "cannot exceed qps"),
        (("--dns-client-qps=0.5",), "--dns-client-qps"),
        (("--dns-client-forwards=0",), "--dns-client-forwards"),
        (("--dns-client-tcp-connections=x",), "--dns-client-tcp-connections"),
    ],
)
def test_bad_flags_are_refused_before_the_agent_starts(
    started: list[AgentConfig], flags: tuple[str, ...], message: str
) -> None:
    done = invoke(*flags)
    assert done.exit_code == 2 and message in done.output, done.output
    assert started == []
