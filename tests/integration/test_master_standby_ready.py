"""A standby master that serves the API is ready (issue 20): ``/readyz`` 200, as in
Kubernetes, so a load balancer that follows it keeps every master; leadership is the
``podnet_master_leader`` gauge of ``/metrics``. Before, a standby answered 503 for as long
as it was standby. Two real masters on one etcd, started by ``podnet cluster up``'s
``ControlPlane``; the leader is SIGKILLed and the standby must stay ready throughout.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from podnet.cluster.controlplane import ControlPlane
from podnet.cluster.state import ClusterState
from podnet.testing.api import kubeconfig_parts
from podnet.testing.e2e import wait_for

GAUGE = re.compile(r"^podnet_master_leader (\S+)$", re.M)


def quiet(line: str) -> None:
    """Progress output of the control plane, kept out of the way."""


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    made = ControlPlane(tmp_path / "cp")
    try:
        made.up("multitenant", [], quiet, 1, 2)
        yield made
    finally:
        made.down(quiet)


def readyz(port: int, path: str = "/readyz") -> int:
    try:
        return httpx.get(f"https://127.0.0.1:{port}{path}", verify=False, timeout=3).status_code
    except httpx.HTTPError:
        return 0


def leads(port: int, token: str) -> bool | None:
    """The master's leader gauge (None: no answer)."""
    try:
        answer = httpx.get(
            f"https://127.0.0.1:{port}/metrics",
            headers={"Authorization": f"Bearer {token}"},
            verify=False,
            timeout=3,
        )
    except httpx.HTTPError:
        return None
    found = GAUGE.search(answer.text) if answer.status_code == 200 else None
    assert found or answer.status_code != 200, "no podnet_master_leader in /metrics"
    return None if found is None else float(found.group(1)) == 1.0


def ports(plane: ControlPlane) -> list[int]:
    state: ClusterState | None = plane.state()
    assert state is not None
    return [m.port for m in state.masters]


def test_a_standby_is_ready_and_the_gauge_names_the_leader(plane: ControlPlane) -> None:
    token = kubeconfig_parts(plane.kubeconfig)[2]
    first, second = ports(plane)
    wait_for(lambda: readyz(first) == 200 and readyz(second) == 200, 15, "both masters ready")
    gauges = wait_for(
        lambda: (g := [leads(first, token), leads(second, token)]).count(True) == 1 and g,
        15,
        "one leader gauge at 1",
    )
    assert sorted(gauges) == [False, True]
    leader, standby = (first, second) if gauges[0] else (second, first)
    # /leaderz (public, as /readyz) tells them apart: what the local cluster's tools wait
    # for when a master must lead
    assert (readyz(leader, "/leaderz"), readyz(standby, "/leaderz")) == (200, 503)
    index = [first, second].index(leader)
    assert plane.kill_master(index) > 0
    answers = []

    def took_over() -> bool:
        answers.append(readyz(standby))
        return bool(leads(standby, token))

    wait_for(took_over, 30, "the standby to take over", interval=0.1)
    answers.append(readyz(standby))
    print(f"standby took over; its /readyz during the takeover: {sorted(set(answers))}")
    assert set(answers) == {200}, answers
    wait_for(lambda: readyz(standby, "/leaderz") == 200, 10, "the new leader's /leaderz")
    assert readyz(leader) == 0  # the killed one answers nothing
