"""The scale benchmark's simulator, run small: correctness only, no timing asserted.

20 simulated agents (each its own node token and HTTPS connections) register against a
real master and etcd, heartbeat, get a HostSubnet each, and watch what the agent watches;
then pod changes are made and every watcher must see every one of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_scale  # noqa: E402

NODES = 20


@pytest.mark.slow
async def test_simulated_agents_register_heartbeat_and_see_every_event(tmp_path: Path) -> None:
    args = bench_scale.options(
        [
            *("--nodes", str(NODES), "--pods", "200", "--namespaces", "4"),
            *("--list-objects", "10", "--rate", "10", "--duration", "10"),
            *("--workers", "2", "--drain", "120", "--log-dir", str(tmp_path / "logs")),
        ]
    )
    out = await bench_scale.run(args, tmp_path / "run")

    assert out["failed registrations"] == 0
    assert out["subnet problems"] == []  # every node one HostSubnet, none twice or overlapping
    assert out["heartbeats"] >= NODES
    assert out["kinds"] == bench_scale.AGENT_KINDS
    assert out["watchers"] == NODES
    assert out["writes"] == 100
    assert out["missed"] == 0
    assert out["unexpected"] == 0
    assert out["per_watcher"] == (100, 100)
