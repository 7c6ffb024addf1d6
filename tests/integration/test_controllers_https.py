"""The controllers as their own process: a real master (+ etcd) with --no-controllers, and
``podnet controllers`` reaching it only over HTTPS with a token, electing through a Lease.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for, node
from podnet.testing.e2e import wait_for
from podnet.testing.processes import (
    MasterProcess,
    controllers_command,
    launch_master,
    stop_process,
)

HS = "/apis/network.openshift.io/v1/hostsubnets"
NETNS = "/apis/network.openshift.io/v1/netnamespaces"
NAMESPACES = "/api/v1/namespaces"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/podnet-controllers"


@pytest.fixture
def api_only_master(etcd: EtcdProcess, tmp_path: Path, prefix: str) -> Iterator[MasterProcess]:
    """A master that serves the API and runs no controllers (ready at once)."""
    process = launch_master(
        etcd, tmp_path / "master", prefix, "--no-controllers", "--network-plugin", "multitenant"
    )
    try:
        yield process
    finally:
        process.stop()


@dataclass
class Controllers:
    """One ``podnet controllers`` process and its log."""

    process: subprocess.Popen[bytes]
    log: Path

    @property
    def identity_suffix(self) -> str:
        return f"-{self.process.pid}"  # the identity is <hostname>-<pid>


@pytest.fixture
def run_controllers(
    api_only_master: MasterProcess, tmp_path: Path
) -> Iterator[Callable[[str], Controllers]]:
    """Start ``podnet controllers`` processes against the master; each is stopped by PID."""
    command = controllers_command(
        api_only_master,
        tmp_path,
        "--network-plugin",
        "multitenant",
        "--lease-seconds",
        "3",
    )
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> Controllers:
        log = tmp_path / f"{name}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        started.append(process)
        return Controllers(process, log)

    yield start
    for process in started:
        stop_process(process)


def _get(api: httpx.Client, path: str) -> dict[str, Any] | None:
    answer = api.get(path)
    return answer.json() if answer.status_code == 200 else None


def test_controllers_over_https_allocate_subnets_and_vnids(
    api_only_master: MasterProcess,
    run_controllers: Callable[[str], Controllers],
) -> None:
    with client_for(api_only_master.kubeconfig) as api:
        assert "campaigning" not in api_only_master.log()  # it runs no controllers
        assert api.post("/api/v1/nodes", json=node("early", "192.0.2.1")).status_code == 201

        controllers = run_controllers("controllers")
        hostsubnet = wait_for(lambda: _get(api, f"{HS}/early"), 60, "a HostSubnet for early")
        assert hostsubnet["hostIP"] == "192.0.2.1"
        assert ipaddress.IPv4Network(hostsubnet["subnet"]).subnet_of(
            ipaddress.IPv4Network("10.128.0.0/14")
        )
        lease = wait_for(lambda: _get(api, LEASE), 30, "the controllers' Lease")
        assert lease["spec"]["holderIdentity"].endswith(controllers.identity_suffix)

        assert api.post("/api/v1/nodes", json=node("late", "192.0.2.2")).status_code == 201
        late = wait_for(lambda: _get(api, f"{HS}/late"), 30, "a HostSubnet for late")
        assert late["subnet"] != hostsubnet["subnet"]

        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant"}}
        assert api.post(NAMESPACES, json=body).status_code == 201
        netns = wait_for(lambda: _get(api, f"{NETNS}/tenant"), 30, "a NetNamespace for tenant")
        assert netns["netid"] >= 10
        default = wait_for(lambda: _get(api, f"{NETNS}/default"), 30, "the default NetNamespace")
        assert default["netid"] == 0

        # Namespace deletion is finalized through the API (namespaces/<name>/finalize),
        # which refuses a Namespace that is not Terminating.
        live = api.get(f"{NAMESPACES}/tenant").json()
        assert api.put(f"{NAMESPACES}/tenant/finalize", json=live).status_code == 409
        assert api.delete(f"{NAMESPACES}/tenant").status_code == 200
        wait_for(lambda: _get(api, f"{NAMESPACES}/tenant") is None, 30, "tenant to be removed")
        wait_for(lambda: _get(api, f"{NETNS}/tenant") is None, 30, "its NetNamespace to go")
        assert controllers.process.poll() is None


def test_a_second_controllers_process_takes_over_the_lease(
    api_only_master: MasterProcess,
    run_controllers: Callable[[str], Controllers],
) -> None:
    with client_for(api_only_master.kubeconfig) as api:
        first = run_controllers("first")
        lease = wait_for(lambda: _get(api, LEASE), 30, "the first process to lead")
        assert lease["spec"]["holderIdentity"].endswith(first.identity_suffix)
        second = run_controllers("second")
        wait_for(lambda: "campaigning" in second.log.read_text(), 30, "the second to campaign")
        assert api.post("/api/v1/nodes", json=node("n1", "192.0.2.1")).status_code == 201
        wait_for(lambda: _get(api, f"{HS}/n1"), 30, "a HostSubnet from the leader")
        lease = _get(api, LEASE) or {}
        assert lease["spec"]["holderIdentity"].endswith(first.identity_suffix)
        assert "acquired leadership" not in second.log.read_text()
        stop_process(first.process)  # releases the Lease: the second takes it at once

        def second_leads() -> bool:
            current = _get(api, LEASE) or {}
            return str(current["spec"]["holderIdentity"]).endswith(second.identity_suffix)

        wait_for(second_leads, 30, "the second process to lead")
        assert api.post("/api/v1/nodes", json=node("n2", "192.0.2.2")).status_code == 201
        wait_for(lambda: _get(api, f"{HS}/n2"), 30, "a HostSubnet from the new leader")
        assert "acquired leadership" in second.log.read_text()


def test_the_controllers_outlive_a_master_restart(
    api_only_master: MasterProcess,
    run_controllers: Callable[[str], Controllers],
) -> None:
    with client_for(api_only_master.kubeconfig) as api:
        controllers = run_controllers("controllers")
        wait_for(lambda: _get(api, LEASE), 30, "the controllers to lead")
    api_only_master.kill()  # the API is gone for a while: watches and renewals fail
    api_only_master.start()  # same port, state and etcd
    with client_for(api_only_master.kubeconfig) as api:
        assert api.post("/api/v1/nodes", json=node("after", "192.0.2.9")).status_code == 201
        wait_for(lambda: _get(api, f"{HS}/after"), 60, "a HostSubnet after the restart")
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "later"}}
        assert api.post(NAMESPACES, json=body).status_code == 201
        wait_for(lambda: _get(api, f"{NETNS}/later"), 60, "a NetNamespace after the restart")
    assert controllers.process.poll() is None
