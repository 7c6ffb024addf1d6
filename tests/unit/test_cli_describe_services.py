"""``podnet describe`` of Services, Endpoints and EndpointSlices, and ``get`` of several
kinds at once (pure views; the client is a fake)."""

from __future__ import annotations

from typing import Any

import pytest

from podnet.cli.resources import parse_refs
from podnet.cli.servicedescribe import (
    describe_endpoint_slice,
    describe_endpoints,
    describe_service,
    describe_view,
    port_endpoints,
)
from podnet.client import StatusError
from podnet.model.kinds import ENDPOINT_SLICE, ENDPOINTS, NODE, SERVICE

SERVICE_OBJ: dict[str, Any] = {
    "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
    "spec": {
        "type": "NodePort",
        "selector": {"app": "web", "tier": "front"},
        "clusterIP": "172.30.0.10",
        "clusterIPs": ["172.30.0.10"],
        "ports": [
            {"name": "http", "port": 80, "targetPort": "web", "nodePort": 30080, "protocol": "TCP"},
            {"name": "dns", "port": 53, "targetPort": 5353, "nodePort": 30053, "protocol": "UDP"},
        ],
        "sessionAffinity": "ClientIP",
        "externalTrafficPolicy": "Local",
    },
}
ENDPOINTS_OBJ: dict[str, Any] = {
    "metadata": {"name": "web", "namespace": "shop"},
    "subsets": [
        {
            "addresses": [{"ip": f"10.128.0.{i}"} for i in range(2, 7)],
            "notReadyAddresses": [{"ip": "10.128.0.9"}],
            "ports": [
                {"name": "http", "port": 8080, "protocol": "TCP"},
                {"name": "dns", "port": 5353, "protocol": "UDP"},
            ],
        }
    ],
}


def test_describe_service_like_kubectl() -> None:
    text = describe_service(SERVICE_OBJ, ENDPOINTS_OBJ)
    lines = text.splitlines()
    assert lines[0] == "Name:                     web"
    assert "Selector:                 app=web,tier=front" in lines
    assert "Type:                     NodePort" in lines
    assert "IP:                       172.30.0.10" in lines
    assert "Port:                     http  80/TCP" in lines
    assert "TargetPort:               web/TCP" in lines
    assert "NodePort:                 http  30080/TCP" in lines
    assert (
        "Endpoints:                10.128.0.2:8080,10.128.0.3:8080,10.128.0.4:8080 + 2 more..."
        in lines
    )
    assert "Port:                     dns  53/UDP" in lines
    assert (
        "Endpoints:                10.128.0.2:5353,10.128.0.3:5353,10.128.0.4:5353 + 2 more..."
        in lines
    )
    assert "Session Affinity:         ClientIP" in lines
    assert "External Traffic Policy:  Local" in lines
    assert "10.128.0.9" not in text, "not-ready addresses are not endpoints of a port"


def test_describe_service_without_endpoints_and_external_name() -> None:
    cluster_ip = {"metadata": {"name": "db"}, "spec": {"clusterIP": "172.30.0.5",
                  "ports": [{"port": 5432}]}}  # fmt: skip
    text = describe_service(cluster_ip, None)
    assert "Type:              ClusterIP" in text.splitlines()
    assert "Port:              <unset>  5432/TCP" in text.splitlines()
    assert "TargetPort:        5432/TCP" in text.splitlines()
    assert "Endpoints:         <none>" in text.splitlines()
    assert "NodePort" not in text and "External Traffic Policy" not in text
    external = {"metadata": {"name": "ext"}, "spec": {"type": "ExternalName",
                "externalName": "db.example.org"}}  # fmt: skip
    lines = describe_service(external, None).splitlines()
    assert "External Name:     db.example.org" in lines
    assert not any(line.startswith("IP:") for line in lines)


def test_port_endpoints_matches_unnamed_ports_and_ipv6() -> None:
    eps = {"subsets": [{"addresses": [{"ip": "fd00::5"}], "ports": [{"port": 80}]}]}
    assert port_endpoints(eps, "") == "[fd00::5]:80"
    assert port_endpoints(eps, "http") == "<none>"
    assert port_endpoints(None, "") == "<none>"


def test_describe_endpoints() -> None:
    lines = describe_endpoints(ENDPOINTS_OBJ).splitlines()
    assert "Subsets:" in lines
    assert "  Addresses:          10.128.0.2,10.128.0.3,10.128.0.4,10.128.0.5,10.128.0.6" in lines
    assert "  NotReadyAddresses:  10.128.0.9" in lines
    at = lines.index("  Ports:")
    assert lines[at + 1 : at + 5] == [
        "    Name   Port   Protocol",
        "    ----   ----   --------",
        "    http   8080   TCP",
        "    dns    5353   UDP",
    ]
    assert describe_endpoints({"metadata": {"name": "x"}}).splitlines()[-2:] == [
        "Subsets:",
        "Events:  <none>",
    ]


def test_describe_endpoint_slice() -> None:
    slice_obj = {
        "metadata": {"name": "web-abc12", "namespace": "shop"},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": ["10.128.0.2"],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": "web-1"},
                "nodeName": "node1",
            },
            {"addresses": ["10.128.0.9"], "conditions": {"ready": False}},
        ],
    }
    lines = describe_endpoint_slice(slice_obj).splitlines()
    assert "AddressType:  IPv4" in lines
    first = lines.index("  - Addresses:  10.128.0.2")
    assert lines[first + 1 : first + 7] == [
        "    Conditions:",
        "      Ready:  true",
        "    Hostname:   <unset>",
        "    TargetRef:  Pod/web-1",
        "    NodeName:   node1",
        "    Zone:       <unset>",
    ]
    assert "      Ready:  false" in lines
    empty = describe_endpoint_slice({"metadata": {"name": "e"}, "addressType": "IPv4"})
    assert "Endpoints:\n  <none>" in empty


class FakeClient:
    def __init__(self, endpoints: dict[str, Any] | None, code: int = 404) -> None:
        self.endpoints, self.code = endpoints, code
        self.asked: list[tuple[str, str, str | None]] = []

    def get(self, kind: Any, namespace: str | None, name: str) -> dict[str, Any]:
        self.asked.append((kind.plural, name, namespace))
        if self.endpoints is None:
            raise StatusError("no", self.code, "NotFound" if self.code == 404 else "Forbidden")
        return self.endpoints


def test_describe_view_reads_the_services_endpoints() -> None:
    client = FakeClient(ENDPOINTS_OBJ)
    assert "10.128.0.2:8080" in describe_view(client, SERVICE, SERVICE_OBJ)
    assert client.asked == [("endpoints", "web", "shop")]
    assert "Endpoints:                <none>" in describe_view(
        FakeClient(None), SERVICE, SERVICE_OBJ
    )
    with pytest.raises(StatusError):
        describe_view(FakeClient(None, 403), SERVICE, SERVICE_OBJ)
    assert "NotReadyAddresses" in describe_view(client, ENDPOINTS, ENDPOINTS_OBJ)
    assert "AddressType" in describe_view(client, ENDPOINT_SLICE, {"addressType": "IPv4"})
    assert "Conditions:" in describe_view(client, NODE, {"metadata": {"name": "n"}})


def test_get_several_kinds_at_once() -> None:
    refs = parse_refs(["svc,ep,endpointslices"])
    assert [(k.plural, n) for k, n in refs] == [
        ("services", None),
        ("endpoints", None),
        ("endpointslices", None),
    ]
    named = parse_refs(["svc,ep", "web", "db"])
    assert [(k.plural, n) for k, n in named] == [
        ("services", "web"),
        ("services", "db"),
        ("endpoints", "web"),
        ("endpoints", "db"),
    ]
