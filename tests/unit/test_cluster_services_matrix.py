"""The local cluster's Service and DNS pieces: the matrix's Services by name (targets,
one source per node, rendering) and the nodes' upstream resolvers (``--dns-upstream``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from podnet.cluster import lifecycle, matrix
from podnet.cluster.matrix import Endpoint, Probe, ServiceResult, ServiceTarget
from podnet.cluster.nodes import agent_command, new_node_record, node_paths
from podnet.cluster.state import ClusterState

A1 = Endpoint("a1", "node1", "10.128.0.2", "pn-x-p-a1")
A2 = Endpoint("a2", "node1", "10.128.0.3", "pn-x-p-a2")
B1 = Endpoint("b1", "node2", "10.128.2.2", "pn-x-p-b1")
WEB = ServiceTarget("web", "default", "172.30.0.10", 80)


def svc(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


def test_targets_are_selector_services_with_a_cluster_ip_and_a_tcp_port() -> None:
    tcp = [{"port": 80}, {"port": 81}]
    found = matrix.service_targets(
        [
            svc("web", selector={"app": "web"}, clusterIP="172.30.0.10", ports=tcp),
            svc("headless", selector={"app": "x"}, clusterIP="None", ports=tcp),
            svc("kubernetes", clusterIP="172.30.0.1", ports=[{"port": 443}]),  # no selector
            svc("dns", selector={"a": "b"}, clusterIP="172.30.0.9", ports=[
                {"port": 53, "protocol": "UDP"}, {"port": 5353, "protocol": "TCP"}]),
            svc("alias", type="ExternalName", externalName="example.org"),
        ]
    )  # fmt: skip
    assert found == [
        ServiceTarget("dns", "default", "172.30.0.9", 5353),
        WEB,
    ]
    assert WEB.dns_name == "web.default"


def test_each_target_is_probed_from_the_first_pod_of_each_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, str]] = []

    def fake(source: Endpoint, target: ServiceTarget) -> ServiceResult:
        seen.append((source.name, target.name))
        return ServiceResult(source.name, source.node, target, (target.cluster_ip,), Probe(True, 1))

    monkeypatch.setattr(matrix, "probe_service", fake)
    results = matrix.probe_services([A1, A2, B1], [WEB], workers=1)
    assert sorted(seen) == [("a1", "web"), ("b1", "web")]
    assert [r.node for r in results] == ["node1", "node2"] and all(r.ok for r in results)


def test_a_name_that_resolves_elsewhere_or_not_at_all_fails() -> None:
    wrong = ServiceResult("a1", "node1", WEB, ("10.0.0.1",), Probe(True, 1))
    missing = ServiceResult("b1", "node2", WEB, (), Probe(False, error="name not resolved"))
    good = ServiceResult("a2", "node1", WEB, ("172.30.0.10",), Probe(True, 0.5))
    assert not wrong.ok and not missing.ok and good.ok
    text = matrix.render_services([good, wrong, missing])
    lines = text.splitlines()
    assert lines[1].split() == ["a2", "(node1)", "web.default:80", "->", "✓", "172.30.0.10",
                                "tcp", "✓0.50"]  # fmt: skip
    assert "✗ 10.0.0.1" in lines[2]
    assert "✗ not resolved" in lines[3] and "(name not resolved)" in lines[3]
    assert lines[-1].startswith("1/3 service lookups ok")


def test_dns_upstreams_are_checked() -> None:
    assert lifecycle.checked_upstreams(None) is None
    assert lifecycle.checked_upstreams(("192.168.100.250",)) == ["192.168.100.250"]
    with pytest.raises(lifecycle.ClusterError, match="bad DNS upstream"):
        lifecycle.checked_upstreams(("resolver.example",))
    with pytest.raises(lifecycle.ClusterError, match="at most 3"):
        lifecycle.checked_upstreams(("1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"))


def test_nodes_forward_to_the_recorded_upstreams_else_the_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = tmp_path / "resolv.conf"
    host.write_text("search example\nnameserver 10.0.0.53\nnameserver bogus\n")
    monkeypatch.setattr(lifecycle, "HOST_RESOLV_CONF", host)
    state = ClusterState(cluster_id="abc123", underlay_cidr="192.168.100.0/24")
    lifecycle.write_upstream_resolv_confs(state, tmp_path, 2)
    for name in ("node1", "node2"):
        assert node_paths(tmp_path, name).upstream_resolv_conf.read_text() == (
            "nameserver 10.0.0.53\n"
        )
    state.dns_upstreams = ["192.168.100.250"]
    lifecycle.write_upstream_resolv_confs(state, tmp_path, 1)
    path = node_paths(tmp_path, "node1").upstream_resolv_conf
    assert path.read_text() == "nameserver 192.168.100.250\n"
    node = new_node_record(state, 1)
    argv = agent_command(state, node, node_paths(tmp_path, "node1"))
    assert argv[argv.index("--dns-upstream-resolv-conf") + 1] == str(path)
