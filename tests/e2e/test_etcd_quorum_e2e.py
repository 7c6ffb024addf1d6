"""A real cluster on a 3-member TLS etcd with two masters: quorum loss and master loss.

- Losing etcd quorum (2 of 3 members SIGKILLed): running pods keep talking (0 lost
  pings), a pod ADD answers CNI code 11 with a clear message, and everything recovers
  by itself when the members come back (ADD works again, no process restarted by hand).
- SIGKILL of the first master: the node relays fail over, an ADD still works.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podnet import netns
from podnet.cluster import lifecycle, pods
from podnet.cluster.controlplane import ControlPlane
from podnet.cluster.nodes import node_paths
from podnet.cluster.state import PodRecord
from podnet.testing.e2e import TEST_DATAPLANE, Ping, wait_for
from podnet.testing.e2e import load_state as load

PINGS = 400  # at 50 ms: 20 s, longer than the outage below


@pytest.fixture(scope="module")
def ha_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """2 nodes, 3 etcd members, 2 masters, one echo pod per node."""
    state_dir = tmp_path_factory.mktemp("pn-ha")
    try:
        spec = lifecycle.ClusterSpec(nodes=2, etcd_members=3, masters=2, dataplane=TEST_DATAPLANE)
        lifecycle.cluster_up(state_dir, spec, say=print)
        pods.run_pod(state_dir, "qa", node="node1")
        pods.run_pod(state_dir, "qb", node="node2")
        yield state_dir
    finally:
        lifecycle.cluster_down(state_dir, say=print)
        assert not state_dir.exists()


def bare_pod(state_dir: Path, node: str) -> PodRecord:
    """A pod namespace (recorded, so `cluster down` removes it) with no API object."""
    state = load(state_dir)
    name = f"q{secrets.token_hex(3)}"
    pod = PodRecord(name, "default", node, pods.pod_netns_name(state, "default", name),
                    secrets.token_hex(32))  # fmt: skip
    state.record_netns(pod.netns, state_dir)
    netns.create(pod.netns)
    return pod


def cni(state_dir: Path, pod: PodRecord, command: str) -> tuple[int, dict[str, Any]]:
    """Run the node's real CNI plugin; (exit code, JSON answer)."""
    paths = node_paths(state_dir, pod.node)
    result = subprocess.run(
        [str(paths.shim)],
        input=pods.plugin_config(paths.conflist),
        env=pods.cni_env(pod, command, paths.cni_bin_dir, str(netns.path(pod.netns))),
        capture_output=True,
        text=True,
        timeout=60,
    )
    answer = json.loads(result.stdout) if result.stdout.strip() else {}
    return result.returncode, answer


def test_quorum_loss_keeps_pods_talking_and_add_is_try_again_later(ha_cluster: Path) -> None:
    plane = ControlPlane(ha_cluster)
    state = load(ha_cluster)
    src, dst = state.pods["default/qa"], state.pods["default/qb"]
    pids = {n: r.agent.pid for n, r in state.nodes.items() if r.agent}
    ping = Ping(src.netns, dst.ip, PINGS, 0.05)
    waiting = bare_pod(ha_cluster, "node1")
    try:
        ping.flowing()
        plane.kill_member(0)
        plane.kill_member(1)
        code, answer = cni(ha_cluster, waiting, "ADD")
        assert code != 0 and answer.get("code") == 11, answer
        assert "try again later" in answer.get("msg", ""), answer
        plane.restart_member(0, print)
        plane.restart_member(1, print)
        assert ping.running(), "quorum came back after the ping had ended"
    finally:
        out = ping.finish()
    assert f"{PINGS} packets transmitted, {PINGS} received" in out, out
    # Recovery by itself: the same ADD now works, with no agent or master restarted.
    wait_for(lambda: cni(ha_cluster, waiting, "ADD")[0] == 0, 90, "ADD after quorum returned")
    assert cni(ha_cluster, waiting, "DEL")[0] == 0
    after = load(ha_cluster)
    assert {n: r.agent.pid for n, r in after.nodes.items() if r.agent} == pids
    assert all(m.process and m.process.alive() for m in after.masters)


def test_first_master_killed_agents_fail_over(ha_cluster: Path) -> None:
    plane = ControlPlane(ha_cluster)
    assert plane.kill_master(0) > 0
    try:
        pod = bare_pod(ha_cluster, "node2")
        code, answer = cni(ha_cluster, pod, "ADD")  # its API read goes through the relay
        assert code == 0, answer
        assert cni(ha_cluster, pod, "DEL")[0] == 0
    finally:
        plane.restart_master(0, print)
