"""Validation of Endpoints (v1) and EndpointSlices (discovery.k8s.io/v1) as Kubernetes
validates them, and their ``kubectl get`` cells."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.model.endpointcells import endpoints_cell, slice_endpoints_cell, slice_ports_cell
from podnet.model.errors import ApiError
from podnet.model.kinds import ENDPOINT_SLICE, ENDPOINTS, KINDS
from podnet.model.schemas_endpoints import special_ip_problem
from podnet.model.validation import validate

Obj = dict[str, Any]


def endpoint_slice(**body: Any) -> Obj:
    obj: Obj = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice"}
    obj["metadata"] = {"name": "web-abc", "namespace": "ns"}
    obj["addressType"] = "IPv4"
    obj.update(body)
    return obj


def causes(kind: Any, obj: Obj, old: Obj | None = None) -> dict[str, str]:
    with pytest.raises(ApiError) as caught:
        validate(kind, obj, old)
    assert caught.value.code == 422
    details = caught.value.status()["details"]
    return {c["field"]: c["message"] for c in details["causes"]}


def test_a_good_slice_gets_kubes_defaults() -> None:
    out = validate(
        ENDPOINT_SLICE,
        endpoint_slice(
            endpoints=[{"addresses": ["10.1.0.5"], "conditions": {"ready": True}, "zone": "a"}],
            ports=[{"port": 8080}, {"name": "metrics", "port": 9090, "appProtocol": "http"}],
        ),
    )
    assert out["ports"][0] == {"name": "", "port": 8080, "protocol": "TCP"}
    assert out["endpoints"][0]["addresses"] == ["10.1.0.5"]
    assert KINDS.by_name("endpointslices") is ENDPOINT_SLICE
    assert KINDS.by_name("endpointslice.discovery.k8s.io") is ENDPOINT_SLICE


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"addressType": "IP"}, "addressType", "Unsupported value"),
        ({"addressType": None}, "addressType", "must be of type string"),
        ({"endpoints": [{"addresses": []}]}, "endpoints[0].addresses", "at least 1 address"),
        ({"endpoints": [{"addresses": ["1.2.3.4"] * 101}]}, "endpoints[0].addresses", "100"),
        ({"endpoints": [{"addresses": ["1.2.3.4"]}] * 1001}, "endpoints", "1000"),
        ({"endpoints": [{"addresses": ["127.0.0.1"]}]}, "endpoints[0].addresses[0]", "loopback"),
        ({"endpoints": [{"addresses": ["0.0.0.0"]}]}, "endpoints[0].addresses[0]", "unspecified"),
        ({"endpoints": [{"addresses": ["169.254.1.1"]}]}, "endpoints[0].addresses[0]", "link"),
        ({"endpoints": [{"addresses": ["224.0.0.5"]}]}, "endpoints[0].addresses[0]", "multicast"),
        ({"endpoints": [{"addresses": ["fd00::1"]}]}, "endpoints[0].addresses[0]", "IPv4"),
        (
            {"endpoints": [{"addresses": ["1.2.3.4"], "hostname": "A"}]},
            "endpoints[0].hostname",
            "label",
        ),
        (
            {"endpoints": [{"addresses": ["1.2.3.4"], "nodeName": "a_b"}]},
            "endpoints[0].nodeName",
            "subdomain",
        ),
        (
            {"endpoints": [{"addresses": ["1.2.3.4"], "conditions": {"ready": "yes"}}]},
            "endpoints[0].conditions.ready",
            "boolean",
        ),
        (
            {"endpoints": [{"addresses": ["1.2.3.4"], "targetRef": {"name": 5}}]},
            "endpoints[0].targetRef.name",
            "string",
        ),
        ({"ports": [{"name": "a"}, {"name": "a"}]}, "ports[1].name", "Duplicate"),
        ({"ports": [{"name": "Web"}]}, "ports[0].name", "DNS-1123 label"),
        ({"ports": [{"port": 70000}]}, "ports[0].port", "65535"),
        ({"ports": [{"protocol": "ICMP"}]}, "ports[0].protocol", "Unsupported value"),
        ({"ports": [{"appProtocol": "-x-"}]}, "ports[0].appProtocol", "name"),
        ({"extra": 1}, "extra", "unknown field"),
    ],
)
def test_bad_slices_name_the_field(body: Obj, field: str, words: str) -> None:
    found = causes(ENDPOINT_SLICE, endpoint_slice(**body))
    assert field in found, found
    assert words in found[field]


def test_fqdn_and_ipv6_slices() -> None:
    validate(
        ENDPOINT_SLICE, endpoint_slice(addressType="IPv6", endpoints=[{"addresses": ["fd00::5"]}])
    )
    validate(
        ENDPOINT_SLICE,
        endpoint_slice(addressType="FQDN", endpoints=[{"addresses": ["db.example.com"]}]),
    )
    found = causes(
        ENDPOINT_SLICE, endpoint_slice(addressType="FQDN", endpoints=[{"addresses": ["db"]}])
    )
    assert "two segments" in found["endpoints[0].addresses[0]"]
    found = causes(
        ENDPOINT_SLICE, endpoint_slice(addressType="IPv6", endpoints=[{"addresses": ["::1"]}])
    )
    assert "loopback" in found["endpoints[0].addresses[0]"]


def test_address_type_is_immutable() -> None:
    old = validate(ENDPOINT_SLICE, endpoint_slice())
    assert (
        "may not change"
        in causes(ENDPOINT_SLICE, endpoint_slice(addressType="IPv6"), old)["addressType"]
    )
    validate(ENDPOINT_SLICE, endpoint_slice(endpoints=[{"addresses": ["10.0.0.1"]}]), old)


def test_endpoints_subsets_as_kube_validates_them() -> None:
    obj: Obj = {"metadata": {"name": "web", "namespace": "ns"}}
    obj["subsets"] = [
        {"ports": [{"port": 80}]},
        {"addresses": [{"ip": "127.0.0.1"}]},
        {"addresses": [{"ip": "10.0.0.3"}], "ports": [{"port": 80}, {"name": "b", "port": 81}]},
        {"notReadyAddresses": [{"ip": "10.0.0.1", "hostname": "Bad_Name", "nodeName": "n_1"}]},
        {
            "addresses": [{"ip": "10.0.0.2"}],
            "ports": [{"name": "x", "port": 0, "protocol": "ICMP"}],
        },
    ]
    found = causes(ENDPOINTS, obj)
    assert "addresses` or `notReadyAddresses" in found["subsets[0]"]
    assert "loopback" in found["subsets[1].addresses[0].ip"]
    assert "Required value" in found["subsets[2].ports[0].name"]
    assert "label" in found["subsets[3].notReadyAddresses[0].hostname"]
    assert "subdomain" in found["subsets[3].notReadyAddresses[0].nodeName"]
    assert "65535" in found["subsets[4].ports[0].port"]
    assert "Unsupported" in found["subsets[4].ports[0].protocol"]
    good = {
        **obj,
        "subsets": [{"notReadyAddresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}],
    }
    assert validate(ENDPOINTS, good)["subsets"][0]["ports"] == [{"port": 80, "protocol": "TCP"}]


def test_kubectl_cells() -> None:
    four = [{"ip": f"10.1.0.{i}"} for i in range(5, 9)]
    ep = {"subsets": [{"addresses": four, "ports": [{"port": 8080}]}]}
    assert endpoints_cell(ep) == "10.1.0.5:8080,10.1.0.6:8080,10.1.0.7:8080 + 1 more..."
    assert (
        endpoints_cell({"subsets": [{"addresses": [{"ip": "fd00::1"}], "ports": [{"port": 53}]}]})
        == "[fd00::1]:53"
    )
    assert endpoints_cell({"subsets": [{"addresses": four[:2]}]}) == "10.1.0.5,10.1.0.6"
    assert endpoints_cell({}) == "<none>"
    one = {
        "endpoints": [
            {"addresses": ["10.1.0.5"]},
            {"addresses": ["10.1.0.6", "10.1.0.7", "10.1.0.8"]},
        ]
    }
    assert slice_endpoints_cell(one) == "10.1.0.5,10.1.0.6,10.1.0.7 + 1 more..."
    assert slice_endpoints_cell({"endpoints": []}) == "<unset>"
    assert slice_ports_cell({"ports": [{"port": 80}, {"name": "dns"}, {}]}) == "80,dns,*"
    assert slice_ports_cell({"ports": []}) == "<unset>"


def _special_by_ipaddress(value: str) -> bool:
    ip = ipaddress.ip_address(value)
    multicast = ipaddress.ip_network("224.0.0.0/24")
    return ip.is_unspecified or ip.is_loopback or ip.is_link_local or ip in multicast


@settings(max_examples=300, deadline=None)
@given(
    ip=st.ip_addresses(v=4)
    | st.sampled_from(["0.0.0.0", "127.0.0.1", "169.254.3.4", "224.0.0.251", "224.0.1.1"])
)
def test_the_fast_ipv4_special_check_agrees_with_ipaddress(ip: Any) -> None:
    assert (special_ip_problem(str(ip)) is not None) == _special_by_ipaddress(str(ip))
