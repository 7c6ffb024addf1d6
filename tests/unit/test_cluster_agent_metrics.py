"""``cluster up`` turns each agent's /metrics on, on 127.0.0.1 of its node namespace only;
a node recorded before (no port) keeps its agent as it was."""

from __future__ import annotations

import json
from pathlib import Path

from podnet.cluster.nodes import (
    AGENT_METRICS_PORT,
    agent_command,
    metrics_location,
    new_node_record,
    node_paths,
)
from podnet.cluster.state import ClusterState


def test_a_new_node_serves_metrics_on_its_namespace_loopback(tmp_path: Path) -> None:
    state = ClusterState(cluster_id="abc123", underlay_cidr="192.168.100.0/24")
    node = new_node_record(state, 1)
    assert node.metrics_port == AGENT_METRICS_PORT
    argv = agent_command(state, node, node_paths(tmp_path, node.name))
    assert argv[:3] == ["nsenter", f"--net=/run/netns/{node.netns}", "--"]
    flag = argv.index("--metrics-address")
    assert argv[flag + 1] == f"127.0.0.1:{AGENT_METRICS_PORT}"
    where = metrics_location(node)
    assert where == f"http://127.0.0.1:{AGENT_METRICS_PORT}/metrics in netns {node.netns}"


def test_the_port_is_saved_and_an_older_record_has_none(tmp_path: Path) -> None:
    state = ClusterState(cluster_id="abc123", underlay_cidr="192.168.100.0/24")
    state.nodes["node1"] = new_node_record(state, 1)
    state.save(tmp_path)
    loaded = ClusterState.load(tmp_path)
    assert loaded is not None and loaded.nodes["node1"].metrics_port == AGENT_METRICS_PORT
    data = json.loads((tmp_path / "state.json").read_text())
    del data["nodes"]["node1"]["metrics_port"]  # as a cluster made before saved it
    old = ClusterState.from_dict(data).nodes["node1"]
    assert old.metrics_port == 0 and metrics_location(old) is None
    assert "--metrics-address" not in agent_command(state, old, node_paths(tmp_path, "node1"))
