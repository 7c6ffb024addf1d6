"""Every manifest in examples/ applies to a live master with ``podnet apply -f examples/``
as the docs run it (issue 20), makes no Node or HostSubnet, and applies again unchanged.
The master is real (its own etcd prefix, multitenant), as ``podnet cluster up`` runs it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import httpx
from click.testing import CliRunner

from podnet.cli.main import CliState, cli
from podnet.cluster.processes import MasterProcess
from podnet.testing.api import client_for
from podnet.testing.e2e import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def podnet(master: MasterProcess, *args: str) -> str:
    result = CliRunner().invoke(
        cli, ["--kubeconfig", str(master.kubeconfig), *args], obj=CliState()
    )
    assert result.exit_code == 0, result.output
    return result.output


def netid(api: httpx.Client, name: str) -> int | None:
    answer = api.get(f"/apis/network.openshift.io/v1/netnamespaces/{name}")
    return answer.json().get("netid") if answer.status_code == 200 else None


def test_every_example_applies_to_a_live_master(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        nodes_before = api.get("/api/v1/nodes").json()["items"]
        first = podnet(master, "apply", "-f", str(EXAMPLES))
        assert "created" in first and "error" not in first, first
        again = podnet(master, "apply", "-f", str(EXAMPLES))
        assert "created" not in again and "configured" not in again, again
        assert api.get("/api/v1/nodes").json()["items"] == nodes_before
        subnets = api.get("/apis/network.openshift.io/v1/hostsubnets").json()["items"]
        assert subnets == []
        for name in ("frontend", "backend"):  # sample.yaml's projects get their VNIDs
            wait_for(partial(netid, api, name), 15, f"a VNID for {name}")
