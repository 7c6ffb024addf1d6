"""The join benchmark's simulator, run small: correctness only, no timing asserted.

3 simulated nodes join at once as ``podnet adm join node`` does (their own bootstrap
token, discovery pinned by the CA hash, a CSR the master signs), then their agents
register and report Ready over mutual TLS with the certificate, no token; the baseline
starts the same nodes on pre-issued tokens.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_join_many  # noqa: E402

NODES = 3


@pytest.mark.slow
async def test_simulated_nodes_join_through_the_csr_path_and_become_ready(tmp_path: Path) -> None:
    args = bench_join_many.options(
        ["--nodes", str(NODES), "--workers", "2", "--log-dir", str(tmp_path / "logs")]
    )
    joined, baseline = await bench_join_many.run(args, tmp_path / "run")

    names = [f"sim-{i:05d}" for i in range(NODES)]
    assert (joined["failed"], joined["failures"]) == (0, [])
    assert sorted(joined["ready"]) == names  # the master showed each Node Ready
    assert joined["ready stored"] == NODES
    assert len(joined["discovered"]) == len(joined["certified"]) == NODES
    for name in names:  # each agent ran on a client certificate, no token
        doc = yaml.safe_load((tmp_path / "run/join/nodes" / name / "node.kubeconfig").read_text())
        user = doc["users"][0]["user"]
        assert "client-certificate-data" in user and "client-key-data" in user
        assert "token" not in user
    assert (baseline["failed"], sorted(baseline["ready"])) == (0, names)
    assert baseline["certified"] == []  # no join in the baseline
