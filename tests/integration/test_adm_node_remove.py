"""``podnet adm node remove NAME`` against a real master (issue 20).

A node registered with its own token, its HostSubnet allocated by the master's
controller, Pods bound to it in two namespaces: after the command its Pods, Node and
HostSubnet are gone, its subnet can be taken again, and its token is refused (401).
Another node and an unbound Pod are untouched; a second run and an unknown node are
clear errors that change nothing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from podnet.api.auth import ensure_node_token
from podnet.api.pki import Pki
from podnet.client.bootstrap import bootstrap_node
from podnet.kubeconfig import ClientConfig
from podnet.testing.api import bootstrap_token, cert_client_for, client_for, namespace, node, pod
from podnet.testing.cli import run_podnet
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess

HS = "/apis/network.openshift.io/v1/hostsubnets"
NODES = "/api/v1/nodes"


def pods_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods"


def register(master: MasterProcess, name: str, ip: str) -> tuple[str, dict[str, Any]]:
    """Register ``name`` with its own token, as the agent does; (token, its HostSubnet)."""
    token = ensure_node_token(master.state_dir / "tokens.csv", name)
    with client_for(master.kubeconfig, token=token) as own:
        answer = own.post(NODES, json=node(name, ip))
        assert answer.status_code == 201, answer.text
    with client_for(master.kubeconfig) as admin:

        def allocated() -> dict[str, Any] | None:
            got = admin.get(f"{HS}/{name}")
            return dict(got.json()) if got.status_code == 200 and got.json().get("subnet") else None

        return token, dict(wait_for(allocated, 20, f"a HostSubnet for {name}"))


def remove(master: MasterProcess, tmp_path: Path, name: str) -> Any:
    return run_podnet(
        master.kubeconfig,
        *("adm", "node", "remove", name, "--master-state-dir", str(master.state_dir)),
        *("--state-dir", str(tmp_path / "no-local-cluster")),
    )


def status_as(master: MasterProcess, token: str, name: str) -> int:
    with client_for(master.kubeconfig, token=token) as own:
        return own.get(f"{NODES}/{name}").status_code


def hostsubnet(name: str, host_ip: str, subnet: str) -> dict[str, Any]:
    return {
        "apiVersion": "network.openshift.io/v1",
        "kind": "HostSubnet",
        "metadata": {"name": name},
        "host": name,
        "hostIP": host_ip,
        "subnet": subnet,
    }


def test_node_remove_deletes_pods_node_subnet_and_token(
    master: MasterProcess, tmp_path: Path
) -> None:
    token, hs = register(master, "n1", "192.0.2.1")
    other_token, other_hs = register(master, "n2", "192.0.2.2")
    with client_for(master.kubeconfig) as admin:
        assert admin.post("/api/v1/namespaces", json=namespace("team")).status_code == 201
        for ns, name, bound in (
            ("default", "a", "n1"),
            ("team", "b", "n1"),
            ("default", "elsewhere", "n2"),
            ("default", "unbound", None),
        ):
            made = admin.post(pods_path(ns), json=pod(name, ns, node_name=bound))
            assert made.status_code == 201, made.text
        # the subnet is n1's: nobody else can take it yet
        taken = admin.post(HS, json=hostsubnet("probe", "192.0.2.9", hs["subnet"]))
        assert taken.status_code == 409, taken.text
    assert status_as(master, token, "n1") == 200

    done = remove(master, tmp_path, "n1")
    assert done.returncode == 0, done.stderr
    assert "revoked the credentials of node n1" in done.stdout
    assert "pod/a deleted" in done.stdout and "pod/b deleted" in done.stdout
    assert "node/n1 deleted" in done.stdout
    assert f"{hs['subnet']} released" in done.stdout

    with client_for(master.kubeconfig) as admin:
        assert admin.get(f"{pods_path('default')}/a").status_code == 404
        assert admin.get(f"{pods_path('team')}/b").status_code == 404
        assert admin.get(f"{NODES}/n1").status_code == 404
        assert admin.get(f"{HS}/n1").status_code == 404
        # untouched: the other node, its pod, its subnet, the unbound pod
        assert admin.get(f"{pods_path('default')}/elsewhere").status_code == 200
        assert admin.get(f"{pods_path('default')}/unbound").status_code == 200
        assert admin.get(f"{NODES}/n2").status_code == 200
        assert admin.get(f"{HS}/n2").json()["subnet"] == other_hs["subnet"]
        # the subnet is free again
        reused = admin.post(HS, json=hostsubnet("reuse", "192.0.2.9", hs["subnet"]))
        assert reused.status_code == 201, reused.text
    wait_for(lambda: status_as(master, token, "n1") == 401, 5, "n1's token refused")
    assert status_as(master, other_token, "n2") == 200

    again = remove(master, tmp_path, "n1")
    assert again.returncode == 1
    assert 'node "n1" not found' in again.stderr and "nothing changed" in again.stderr
    assert status_as(master, other_token, "n2") == 200


def test_node_remove_refuses_unknown_and_bad_names(master: MasterProcess, tmp_path: Path) -> None:
    _, hs = register(master, "n1", "192.0.2.1")
    token = ensure_node_token(master.state_dir / "tokens.csv", "n1")
    for name, reason in (
        ("ghost", 'node "ghost" not found'),
        ("n1,metadata.name=x", "bad node name"),
    ):
        done = remove(master, tmp_path, name)
        assert done.returncode == 1, done.stdout
        assert reason in done.stderr
    missing = run_podnet(
        master.kubeconfig,
        *("adm", "node", "remove", "n1", "--master-state-dir", str(tmp_path / "elsewhere")),
    )
    assert missing.returncode == 1 and "run this on a master host" in missing.stderr
    assert status_as(master, token, "n1") == 200  # its token still works
    with client_for(master.kubeconfig) as admin:
        assert admin.get(f"{NODES}/n1").status_code == 200
        assert admin.get(f"{HS}/n1").json()["subnet"] == hs["subnet"]


def test_removed_node_cannot_come_back_with_its_token(
    master: MasterProcess, tmp_path: Path
) -> None:
    token, _ = register(master, "n1", "192.0.2.1")
    done = remove(master, tmp_path, "n1")
    assert done.returncode == 0, done.stderr

    wait_for(lambda: status_as(master, token, "n1") == 401, 5, "n1's token refused")
    with client_for(master.kubeconfig, token=token) as own:
        answer: httpx.Response = own.post(NODES, json=node("n1", "192.0.2.1"))
        assert answer.status_code == 401, answer.text
    with client_for(master.kubeconfig) as admin:
        assert admin.get(f"{NODES}/n1").status_code == 404


def test_node_remove_finishes_a_removal_cut_short(master: MasterProcess, tmp_path: Path) -> None:
    """The Node was deleted by hand (or a run stopped after it): the token and the bound
    pod are still there, and the command removes them."""
    token, _ = register(master, "n1", "192.0.2.1")
    with client_for(master.kubeconfig) as admin:
        assert admin.post(pods_path("default"), json=pod("a", node_name="n1")).status_code == 201
        assert admin.delete(f"{NODES}/n1").status_code == 200
    done = remove(master, tmp_path, "n1")
    assert done.returncode == 0, done.stderr
    assert "revoked the credentials of node n1" in done.stdout
    assert "node/n1 deleted" not in done.stdout
    wait_for(lambda: status_as(master, token, "n1") == 401, 5, "n1's token refused")
    with client_for(master.kubeconfig) as admin:
        assert admin.get(f"{pods_path('default')}/a").status_code == 404


def join(master: MasterProcess, tmp_path: Path, name: str) -> Path:
    """A node kubeconfig with a client certificate, as `adm join node` gets it."""
    config = ClientConfig(
        master.server, Pki.at(master.state_dir / "pki").ca_pem(), bootstrap_token(master.state_dir)
    )
    out = tmp_path / f"{name}-{time.monotonic_ns()}.kubeconfig"
    asyncio.run(bootstrap_node(config, name, tmp_path / f"{name}.key", out, timeout=30))
    return out


@pytest.mark.slow
def test_a_removed_nodes_certificate_is_refused_and_a_new_join_works(
    master: MasterProcess, tmp_path: Path
) -> None:
    first = join(master, tmp_path, "n3")
    with cert_client_for(first) as own:
        assert own.post(NODES, json=node("n3", "192.0.2.3")).status_code == 201
    done = remove(master, tmp_path, "n3")
    assert done.returncode == 0, done.stderr
    assert "revoked the credentials of node n3" in done.stdout

    def refused() -> bool:
        with cert_client_for(first) as own:
            return own.get(f"{NODES}/n3").status_code == 401

    wait_for(refused, 5, "the removed node's certificate refused")
    time.sleep(1.1)  # a certificate issued after the revocation's second
    second = join(master, tmp_path, "n3")
    with cert_client_for(second) as own:
        assert own.post(NODES, json=node("n3", "192.0.2.3")).status_code == 201
    assert refused()  # the old one stays revoked
