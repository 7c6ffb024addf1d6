"""The endpoints controller out of process: a master with --no-controllers and
``podnet controllers`` reaching it over HTTPS with a token, as ``podnet controllers``
runs in production. Endpoints and slices follow a pod's readiness the same way."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for, namespace
from podnet.testing.e2e import wait_for
from podnet.testing.processes import (
    MasterProcess,
    controllers_command,
    launch_master,
    stop_process,
)

NS = "remote"
CORE = f"/api/v1/namespaces/{NS}"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


@pytest.fixture
def master_and_controllers(
    etcd: EtcdProcess, tmp_path: Path, prefix: str
) -> Iterator[MasterProcess]:
    """A master without controllers, and one ``podnet controllers`` process (stopped by
    PID, killed if it does not stop)."""
    master = launch_master(etcd, tmp_path / "master", prefix, "--no-controllers")
    command = controllers_command(master, tmp_path, "--no-leader-elect")
    with open(tmp_path / "controllers.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield master
    finally:
        stop_process(process)
        master.stop()


def _ready_ips(api: httpx.Client, field: str) -> list[str] | None:
    answer = api.get(f"{CORE}/endpoints/web")
    if answer.status_code != 200:
        return None
    subsets = answer.json().get("subsets") or []
    return sorted(a["ip"] for s in subsets for a in s.get(field) or [])


def _slice_conditions(api: httpx.Client) -> list[tuple[str, bool]]:
    items = api.get(SLICES).json()["items"]
    return sorted(
        (e["addresses"][0], e["conditions"]["ready"]) for s in items for e in s["endpoints"] or []
    )


def _status(api: httpx.Client, ready: bool) -> None:
    current: dict[str, Any] = api.get(f"{CORE}/pods/a").json()
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    current["status"] = {"phase": "Running", "podIP": "10.128.0.5", "conditions": [condition]}
    assert api.put(f"{CORE}/pods/a/status", json=current).status_code == 200


def test_out_of_process_controllers_keep_endpoints(master_and_controllers: MasterProcess) -> None:
    with client_for(master_and_controllers.kubeconfig) as api:
        assert api.post("/api/v1/namespaces", json=namespace(NS)).status_code == 201
        svc = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }
        assert api.post(f"{CORE}/services", json=svc).status_code == 201
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "a", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        }
        assert api.post(f"{CORE}/pods", json=pod).status_code == 201
        _status(api, ready=False)
        wait_for(lambda: _ready_ips(api, "notReadyAddresses") == ["10.128.0.5"], 60, "not ready")
        wait_for(lambda: _slice_conditions(api) == [("10.128.0.5", False)], 30, "slice not ready")
        _status(api, ready=True)
        wait_for(lambda: _ready_ips(api, "addresses") == ["10.128.0.5"], 30, "ready")
        wait_for(lambda: _slice_conditions(api) == [("10.128.0.5", True)], 30, "slice ready")
