"""``podnet trace`` through the real CLI against a real master: VNIDs and NetworkPolicy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for, namespace, pod
from podnet.testing.cli import run_podnet
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess, launch_master

NETNS = "/apis/network.openshift.io/v1/netnamespaces"
POLICIES = "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"


def running_pod(name: str, ns: str, ip: str, labels: dict[str, str] | None = None) -> Any:
    """A Pod as a kubelet leaves it: bound to a node, Running, with its IP."""
    obj = pod(name, ns, "node1", labels)
    obj["spec"]["containers"][0]["ports"] = [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"}
    ]
    obj["status"] = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
    return obj


def create(api: httpx.Client, path: str, obj: Any) -> None:
    response = api.post(path, json=obj)
    assert response.status_code == 201, response.text


def wait_netids(api: httpx.Client, names: set[str], timeout: float = 20.0) -> dict[str, int]:
    def all_there() -> dict[str, int] | None:
        ids = {n["netname"]: n["netid"] for n in api.get(NETNS).json()["items"]}
        return ids if names <= set(ids) else None

    return dict(wait_for(all_there, timeout, f"NetNamespaces {names}"))


def populate(api: httpx.Client) -> dict[str, int]:
    """Namespaces a and b, pods a/web, a/client, b/db and default/tool; the VNIDs."""
    for name in ("a", "b"):
        create(api, "/api/v1/namespaces", namespace(name, {"team": name}))
    pods = [
        ("web", "a", "10.128.0.10", {"app": "web"}),
        ("client", "a", "10.128.0.11", {"app": "client"}),
        ("db", "b", "10.128.1.10", {"app": "db"}),
        ("tool", "default", "10.128.0.12", {"app": "tool"}),
    ]
    for name, ns, ip, labels in pods:
        create(api, f"/api/v1/namespaces/{ns}/pods", running_pod(name, ns, ip, labels))
    return wait_netids(api, {"default", "a", "b"})


def trace(master: MasterProcess, *args: str) -> tuple[int, str, str]:
    result = run_podnet(master.kubeconfig, "trace", *args)
    return result.returncode, result.stdout, result.stderr


def test_multitenant_verdicts_name_both_vnids(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        ids = populate(api)
    code, out, err = trace(master, "a/client", "a/web", "--port", "8080")
    assert code == 0, err
    assert out.startswith("ALLOWED: pod a/client (10.128.0.11 on node1) -> pod a/web")
    assert "mode: multitenant (redhat/openshift-ovs-multitenant)" in out
    assert f"VNIDs: source {ids['a']}, destination {ids['a']}" in out
    assert f"share VNID {ids['a']}" in out

    code, out, err = trace(master, "a/client", "b/db", "--port", "8080")
    assert code == 0, err
    assert out.startswith("DENIED: pod a/client")
    assert f"VNIDs: source {ids['a']}, destination {ids['b']}" in out
    assert f"denied because: VNID {ids['a']} may not reach VNID {ids['b']}" in out

    code, out, err = trace(master, "10.128.0.12", "10.128.1.10")  # by IP, ICMP
    assert code == 0, err
    assert out.startswith("ALLOWED: pod default/tool (10.128.0.12 on node1) -> pod b/db")
    assert "icmp" in out.splitlines()[0] and "VNIDs: source 0," in out


def test_joined_projects_then_reach_each_other(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        populate(api)
    joined = run_podnet(master.kubeconfig, "adm", "pod-network", "join-projects", "--to=a", "b")
    assert joined.returncode == 0, joined.stderr
    code, out, _ = trace(master, "a/client", "b/db", "--port", "5432")
    assert code == 0 and out.startswith("ALLOWED:"), out


def test_matrix_over_selected_namespaces(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        populate(api)
    code, out, err = trace(master, "--matrix", "-n", "a", "-n", "b", "--port", "8080")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[-3:] == ["a/client", "a/web", "b/db"]
    assert lines[1].split() == ["a/client", "✓", "✓", "✗"]
    assert lines[3].split() == ["b/db", "✗", "✗", "✓"]
    assert "default/tool" not in out
    assert lines[-1].startswith("✓ allowed, ✗ denied: tcp/8080, mode multitenant")


def test_errors_are_one_line_and_exit_1(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        populate(api)
    for args, words in [
        (("a/nope", "b/db"), 'pod "nope" not found in namespace "a"'),
        (("a/web", "10.0.0.300"), "not a valid IPv4 address"),
        (("a/web", "b/db", "--port", "0"), "--port"),
        (("a/web", "b/db", "--protocol", "sctp", "--port", "80", "--probe"), "SCTP"),
        (("a/web",), "SRC and DST"),
    ]:
        code, out, err = trace(master, *args)
        assert code == 1 and out == "", (args, out, err)
        assert err.count("\n") == 1 and words in err and "Traceback" not in err, (args, err)


@pytest.fixture
def policy_master(etcd: EtcdProcess, tmp_path: Path, prefix: str) -> Iterator[MasterProcess]:
    """A real master running the networkpolicy plugin."""
    process = launch_master(etcd, tmp_path / "master", prefix, "--network-plugin", "networkpolicy")
    try:
        yield process
    finally:
        process.stop()


def allow_web_from_client() -> dict[str, Any]:
    """Pods app=web of a accept TCP on the named port http from app=client pods only."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "web-from-client", "namespace": "a"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                    "ports": [{"protocol": "TCP", "port": "http"}],
                }
            ],
        },
    }


def test_network_policy_verdicts_name_the_rule(policy_master: MasterProcess) -> None:
    with client_for(policy_master.kubeconfig) as api:
        populate(api)
        create(api, POLICIES.format(ns="a"), allow_web_from_client())
    code, out, err = trace(policy_master, "a/client", "a/web", "--port", "8080")
    assert code == 0, err
    assert out.startswith("ALLOWED:") and "allowed by: a/web-from-client/ingress/0" in out
    assert "mode: networkpolicy (redhat/openshift-ovs-networkpolicy)" in out

    code, out, err = trace(policy_master, "b/db", "a/web", "--port", "8080")
    assert code == 0, err
    assert out.startswith("DENIED: pod b/db")
    assert "isolated by a/web-from-client" in out
    assert "a/web-from-client/ingress/0: 10.128.1.10 is not among its peers" in out

    code, out, _ = trace(policy_master, "a/client", "a/web", "--port", "9090")
    assert out.startswith("DENIED:") and "tcp/9090 is not among its ports" in out

    code, out, err = trace(policy_master, "--matrix", "--port", "8080")
    assert code == 0, err
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:5]}
    # columns: a/client, a/web, b/db, default/tool; only a/web is isolated
    assert rows["a/client"] == ["✓", "✓", "✓", "✓"]
    assert rows["b/db"] == ["✓", "✗", "✓", "✓"]
    assert rows["default/tool"] == ["✓", "✗", "✓", "✓"]
