"""``podnet trace`` through a Service: route, per-endpoint verdicts, the text, and the CLI
with a fake API and fake probes."""

from __future__ import annotations

import re
from collections.abc import Callable
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from podnet.cli.main import CliState, cli
from podnet.client.sync import ApiClient
from podnet.cluster import matrix
from podnet.cluster.matrix import Endpoint, Probe
from podnet.cluster.state import ClusterState, PodRecord
from podnet.kubeconfig import ClientConfig
from podnet.model.network import NETWORKPOLICY
from podnet.policy.compile import compile_rules
from podnet.policy.servicetrace import (
    backend_verdicts,
    expected_reach,
    find_service,
    may_be_service,
    render_service_trace,
    service_name,
    service_route,
)
from podnet.policy.trace import TraceError

Obj = dict[str, Any]
SERVER = "https://api.test:6443"


def pod(name: str, ip: str, **labels: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "a", "labels": labels},
        "spec": {"nodeName": "node1", "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "podIP": ip},
    }


PODS = [
    pod("client", "10.128.0.11", app="client"),
    pod("web1", "10.128.0.21", app="web", open="yes"),
    pod("web2", "10.128.0.22", app="web"),
    pod("web3", "10.128.0.23", app="web"),
]
# Only pods labelled open=yes take traffic from anyone; the others none.
POLICIES = [
    {
        "metadata": {"name": "deny-all", "namespace": "a"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]},
    },
    {
        "metadata": {"name": "open", "namespace": "a"},
        "spec": {"podSelector": {"matchLabels": {"open": "yes"}}, "ingress": [{}]},
    },
]
SERVICE: Obj = {
    "metadata": {"name": "web", "namespace": "a"},
    "spec": {
        "clusterIP": "172.30.0.10",
        "externalIPs": ["192.168.100.200"],
        "selector": {"app": "web"},
        "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        "sessionAffinity": "ClientIP",
    },
}


def address(name: str, ip: str) -> Obj:
    return {"ip": ip, "nodeName": "node1", "targetRef": {"kind": "Pod", "namespace": "a",
            "name": name}}  # fmt: skip


ENDPOINTS: Obj = {
    "metadata": {"name": "web", "namespace": "a"},
    "subsets": [
        {
            "addresses": [address("web1", "10.128.0.21"), address("web2", "10.128.0.22")],
            "notReadyAddresses": [address("web3", "10.128.0.23")],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        }
    ],
}


def ruleset() -> Any:
    namespaces = [{"metadata": {"name": "a"}}]
    return compile_rules(NETWORKPOLICY, PODS, namespaces, [], POLICIES)


def test_service_names_and_what_may_be_one() -> None:
    assert service_name("svc/a/web") == ("a", "web")
    assert service_name("service/a/web") == ("a", "web")
    assert service_name("a/web") is None
    for bad in ("svc/a", "svc//web", "svc/a/b/c"):
        with pytest.raises(TraceError, match="svc/NAMESPACE/NAME"):
            service_name(bad)
    assert may_be_service("svc/a/web") and may_be_service("172.30.0.10")
    assert not may_be_service("a/web") and not may_be_service("10.0.0.0/8")


def test_find_service_by_name_cluster_ip_and_external_ip() -> None:
    assert find_service("svc/a/web", [SERVICE]) == (SERVICE, "172.30.0.10")
    assert find_service("172.30.0.10", [SERVICE]) == (SERVICE, "172.30.0.10")
    assert find_service("192.168.100.200", [SERVICE]) == (SERVICE, "192.168.100.200")
    assert find_service("10.128.0.21", [SERVICE]) is None, "a pod IP is not a service"
    with pytest.raises(TraceError, match='service "nope" not found in namespace "a"'):
        find_service("svc/a/nope", [SERVICE])


def test_route_lists_ready_and_not_ready_endpoints_on_the_named_target_port() -> None:
    route = service_route(SERVICE, "172.30.0.10", ENDPOINTS, 80, "TCP")
    assert (route.port, route.protocol, route.port_name, route.target) == (
        80,
        "TCP",
        "http",
        "http",
    )
    assert [(str(b.ip), b.port, b.ready, b.pod) for b in route.backends] == [
        ("10.128.0.21", 8080, True, "a/web1"),
        ("10.128.0.22", 8080, True, "a/web2"),
        ("10.128.0.23", 8080, False, "a/web3"),
    ]
    assert service_route(SERVICE, "172.30.0.10", ENDPOINTS, None, None).port == 80
    assert service_route(SERVICE, "172.30.0.10", None, 80, None).backends == ()


@pytest.mark.parametrize(
    ("service", "port", "words"),
    [
        ({"spec": {"type": "ExternalName", "externalName": "x.org"}}, 80, "ExternalName"),
        ({"spec": {"clusterIP": "None", "ports": [{"port": 80}]}}, 80, "headless"),
        (SERVICE, 81, "has no port 81/TCP; it has 80/TCP"),
        (
            {"spec": {"clusterIP": "1.2.3.4", "ports": [{"name": "a", "port": 1},
                                                       {"name": "b", "port": 2}]}},
            None,
            "several ports",
        ),
    ],
)  # fmt: skip
def test_route_refuses_clearly(service: Obj, port: int | None, words: str) -> None:
    address = (service.get("spec") or {}).get("clusterIP") or ""
    with pytest.raises(TraceError, match=re.escape(words)):
        service_route(service, address, None, port, "TCP" if port else None)


def test_each_ready_endpoint_gets_its_own_verdict_after_dnat() -> None:
    route = service_route(SERVICE, "172.30.0.10", ENDPOINTS, 80, "TCP")
    verdicts = backend_verdicts(ruleset(), IPv4Address("10.128.0.11"), route)
    assert [(str(b.ip), v.allowed, v.port) for b, v in verdicts] == [
        ("10.128.0.21", True, 8080),
        ("10.128.0.22", False, 8080),
    ]
    assert expected_reach(verdicts) is None
    assert expected_reach(verdicts[:1]) is True and expected_reach(verdicts[1:]) is False
    assert expected_reach([]) is False, "no ready endpoint: rejected"
    text = render_service_trace("a/client", route, verdicts)
    lines = text.splitlines()
    assert lines[0] == (
        'service a/web: a/client -> 172.30.0.10 tcp/80 (port "http", targetPort http, '
        "session affinity ClientIP)"
    )
    assert lines[1] == "endpoints: 2 ready (picked at random), 1 not ready"
    assert lines[2].startswith("  ALLOWED    10.128.0.21:8080  a/web1 (node1)  allowed by:")
    assert lines[3].startswith("  DENIED     10.128.0.22:8080  a/web2 (node1)  denied because:")
    assert lines[4] == "  not ready  10.128.0.23:8080  a/web3 (node1)  (never picked)"
    assert lines[5] == "MIXED: 1 of 2 endpoints allow it; it depends on the pick"
    empty = service_route(SERVICE, "172.30.0.10", None, 80, "TCP")
    assert render_service_trace("a/client", empty, []).splitlines()[-1].startswith("REJECTED")


# --- the CLI ------------------------------------------------------------------------------


class FakeApi:
    def __init__(self, endpoints: Obj | None = ENDPOINTS) -> None:
        self.lists: dict[str, list[Obj]] = {
            "pods": PODS,
            "namespaces": [{"metadata": {"name": "a"}}],
            "netnamespaces": [],
            "networkpolicies": POLICIES,
            "egressnetworkpolicies": [],
            "hostsubnets": [],
            "services": [SERVICE],
        }
        self.endpoints = endpoints

    def handler(self, request: httpx.Request) -> httpx.Response:
        parts = request.url.path.rstrip("/").split("/")
        if parts[-1] == "default":
            return httpx.Response(200, json={"pluginName": NETWORKPOLICY})
        if parts[-2] == "endpoints":
            if self.endpoints is None:
                return httpx.Response(404, json={"kind": "Status", "code": 404})
            return httpx.Response(200, json=self.endpoints)
        return httpx.Response(200, json={"kind": "List", "items": self.lists[parts[-1]]})


def run(api: FakeApi, *args: str) -> Result:
    def factory(config: ClientConfig, *, log: Callable[[str], None] | None = None) -> ApiClient:
        return ApiClient(config, transport=httpx.MockTransport(api.handler), log=log)

    state = CliState(make_client=factory, load_config=lambda _path: ClientConfig(SERVER))
    return CliRunner().invoke(cli, ["trace", *args], obj=state)


def test_cli_traces_a_service_by_name_and_by_cluster_ip() -> None:
    by_name = run(FakeApi(), "a/client", "svc/a/web", "--port", "80")
    assert by_name.exit_code == 0, by_name.output
    assert by_name.stdout.startswith("service a/web: a/client -> 172.30.0.10 tcp/80")
    by_ip = run(FakeApi(), "a/client", "172.30.0.10")
    assert by_ip.exit_code == 0, by_ip.output
    assert by_ip.stdout == by_name.stdout, "the only port is taken without --port"
    none = run(FakeApi(None), "a/client", "svc/a/web", "--port", "80")
    assert "REJECTED" in none.stdout
    missing = run(FakeApi(), "a/client", "svc/a/nope")
    assert missing.exit_code == 1 and 'service "nope" not found' in missing.stderr


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Path:
    state = ClusterState(plugin="networkpolicy", cluster_id="t1")
    record = PodRecord("client", "a", "node1", "pn-t1-p-client", "c", ip="10.128.0.11")
    state.pods[record.key] = record
    state.save(tmp_path)
    return tmp_path


def test_cli_probe_checks_each_endpoint_and_the_service(
    cluster_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str | None, int | None]] = []
    answers = {"10.128.0.21": True, "10.128.0.22": True, "172.30.0.10": True}

    def fake(source: Endpoint, dst: str, protocol: str = "ICMP", port: int | None = None) -> Probe:
        calls.append((dst, protocol, port))
        return Probe(answers[dst], 0.1, "" if answers[dst] else "timed out")

    monkeypatch.setattr(matrix, "probe", fake)
    flags = ("--port", "80", "--probe", "--state-dir", str(cluster_dir))
    result = run(FakeApi(), "a/client", "svc/a/web", *flags)
    assert calls == [
        ("10.128.0.21", "TCP", 8080),
        ("10.128.0.22", "TCP", 8080),
        ("172.30.0.10", "TCP", 80),
    ]
    assert result.exit_code == 3, "web2 answered though its verdict is DENIED"
    lines = result.stdout.splitlines()
    assert lines[-3] == "10.128.0.21:8080: probe: connected (data plane agrees)"
    assert lines[-2].startswith("10.128.0.22:8080: DISAGREEMENT")
    assert lines[-1] == "172.30.0.10:80: probe: connected (mixed verdicts: either is right)"
    answers["10.128.0.22"] = False
    assert run(FakeApi(), "a/client", "svc/a/web", *flags).exit_code == 0
    answers["172.30.0.10"] = False
    no_endpoints = run(FakeApi(None), "a/client", "svc/a/web", *flags)
    assert no_endpoints.exit_code == 0, "rejected as the rules say"
    assert no_endpoints.stdout.splitlines()[-1].startswith("172.30.0.10:80: probe: no answer")
