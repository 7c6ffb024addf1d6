"""``podnet node`` without ``--node-ip`` (issue 20): the agent detects its address at start,
inside its running event loop, as a real host's unit runs it.

Before the fix the detection called pyroute2's synchronous ``IPRoute`` on the agent's loop
and the command died with ``RuntimeError: This event loop is already running``; every
test passed ``--node-ip``, so none saw it. Here the command runs as the unit runs it (no
``--node-ip``), only the agent's body after start is stood in for.
"""

from __future__ import annotations

from ipaddress import IPv4Address
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from podnet.agent import agent as agent_module
from podnet.agent.config import AgentConfig, NodeIPNotFound, detect_node_ip
from podnet.cli.main import CliState, cli
from podnet.kubeconfig import write_kubeconfig


def outside_a_loop() -> IPv4Address | str:
    """What the detection finds, called where no event loop runs (or why it finds none)."""
    try:
        return detect_node_ip()
    except NodeIPNotFound as exc:
        return str(exc)


@pytest.fixture
def expected() -> IPv4Address | str:
    """A sync fixture: it runs before the test's event loop does."""
    return outside_a_loop()


async def test_resolved_node_ip_runs_inside_the_agents_loop(expected: IPv4Address | str) -> None:
    config = AgentConfig(node_name="n1")
    if isinstance(expected, str):
        with pytest.raises(NodeIPNotFound):
            await config.resolved_node_ip()
    else:
        assert await config.resolved_node_ip() == expected


async def test_a_given_node_ip_is_not_detected() -> None:
    config = AgentConfig(node_name="n1", node_ip=IPv4Address("192.0.2.77"))
    assert await config.resolved_node_ip() == IPv4Address("192.0.2.77")


class StandInAgent:
    """The agent's body after start: records what ``podnet node`` gave it."""

    started: list[IPv4Address] = []

    def __init__(self, config: AgentConfig, dataplane: Any, api: Any, node_ip: IPv4Address):
        from prometheus_client import CollectorRegistry

        self.node_ip = node_ip
        self.metrics = SimpleNamespace(registry=CollectorRegistry())  # what the rotation uses

    async def run(self, stop: Any) -> None:
        StandInAgent.started.append(self.node_ip)


def test_podnet_node_without_node_ip_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = outside_a_loop()
    kubeconfig = tmp_path / "node.kubeconfig"
    write_kubeconfig(kubeconfig, "https://127.0.0.1:1", b"", "token", user="system:node:n1")
    monkeypatch.setattr(agent_module, "NodeAgent", StandInAgent)
    StandInAgent.started = []
    args = [
        *("--kubeconfig", str(kubeconfig), "node", "--node-name", "n1"),
        *("--dataplane", "fake", "--state-dir", str(tmp_path / "state")),
        *("--cni-bin-dir", str(tmp_path / "bin"), "--cni-conf-dir", str(tmp_path / "net.d")),
        *("--ipam-dir", str(tmp_path / "ipam"), "--socket", str(tmp_path / "cni.sock")),
    ]
    result = CliRunner().invoke(cli, args, obj=CliState())
    assert "already running" not in result.output, result.output
    if isinstance(expected, str):
        assert "no global IPv4 address" in result.output, result.output
    else:
        assert result.exit_code == 0, result.output
        assert StandInAgent.started == [expected]
