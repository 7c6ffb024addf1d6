"""The Service schema: kube's field rules, defaults and update rules (no store)."""

from __future__ import annotations

from typing import Any

import pytest

from podnet.model import kinds as K
from podnet.model.errors import ApiError
from podnet.model.validation import validate
from podnet.testing.protobuf import field, vfield


def svc(spec: dict[str, Any], name: str = "web") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


def spec_of(spec: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = validate(K.SERVICE, svc(spec), old)["spec"]
    return out


def causes(spec: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, str]:
    with pytest.raises(ApiError) as err:
        validate(K.SERVICE, svc(spec), old)
    assert err.value.code == 422 and err.value.reason == "Invalid"
    return {c.field: f"{c.reason}: {c.message}" for c in err.value.causes}


PORT = [{"port": 80}]


def test_cluster_ip_defaults_match_kube_apiserver() -> None:
    out = validate(K.SERVICE, svc({"ports": PORT, "selector": {"app": "web"}}))
    assert out["spec"] == {
        "type": "ClusterIP",
        "ports": [{"protocol": "TCP", "port": 80, "targetPort": 80}],
        "selector": {"app": "web"},
        "sessionAffinity": "None",
        "internalTrafficPolicy": "Cluster",
        "ipFamilyPolicy": "SingleStack",
    }
    assert out["status"] == {"loadBalancer": {}}


def test_node_port_and_load_balancer_defaults() -> None:
    node_port = spec_of({"type": "NodePort", "ports": PORT})
    assert node_port["externalTrafficPolicy"] == "Cluster"
    assert "allocateLoadBalancerNodePorts" not in node_port
    balancer = spec_of({"type": "LoadBalancer", "ports": PORT})
    assert balancer["externalTrafficPolicy"] == "Cluster"
    assert balancer["allocateLoadBalancerNodePorts"] is True
    # ClusterIP with externalIPs is externally reachable: it gets a policy too.
    external = spec_of({"ports": PORT, "externalIPs": ["192.0.2.10"]})
    assert external["externalTrafficPolicy"] == "Cluster"


def test_client_ip_affinity_gets_the_default_timeout_and_checks_its_range() -> None:
    out = spec_of({"ports": PORT, "sessionAffinity": "ClientIP"})
    assert out["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 10800}}
    kept = spec_of(
        {
            "ports": PORT,
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
        }
    )
    assert kept["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] == 60
    for bad in (0, 86401):
        config = {"clientIP": {"timeoutSeconds": bad}}
        found = causes(
            {"ports": PORT, "sessionAffinity": "ClientIP", "sessionAffinityConfig": config}
        )
        assert "between 1 and 86400" in found["spec.sessionAffinityConfig.clientIP.timeoutSeconds"]
    config = {"clientIP": {"timeoutSeconds": 60}}
    found = causes({"ports": PORT, "sessionAffinityConfig": config})
    assert "sessionAffinity is None" in found["spec.sessionAffinityConfig.clientIP"]
    assert (
        "Unsupported value"
        in causes({"ports": PORT, "sessionAffinity": "Sticky"})["spec.sessionAffinity"]
    )


def test_enums_and_types() -> None:
    found = causes(
        {
            "type": "Magic",
            "ports": [{"port": 80, "protocol": "ICMP", "appProtocol": "not valid!"}],
            "internalTrafficPolicy": "Nearby",
            "publishNotReadyAddresses": "yes",
            "ipFamilyPolicy": "Any",
        }
    )
    assert "Unsupported value" in found["spec.type"]
    assert "Unsupported value" in found["spec.ports[0].protocol"]
    assert "spec.ports[0].appProtocol" in found
    assert "Unsupported value" in found["spec.internalTrafficPolicy"]
    assert "boolean" in found["spec.publishNotReadyAddresses"]
    assert "Unsupported value" in found["spec.ipFamilyPolicy"]
    ok = spec_of(
        {
            "ports": [{"port": 80, "protocol": "SCTP", "appProtocol": "kubernetes.io/h2c"}],
            "publishNotReadyAddresses": True,
            "internalTrafficPolicy": "Local",
        }
    )
    assert ok["ports"][0]["appProtocol"] == "kubernetes.io/h2c"
    assert ok["publishNotReadyAddresses"] is True and ok["internalTrafficPolicy"] == "Local"


def test_external_traffic_policy_only_where_traffic_comes_from_outside() -> None:
    found = causes({"ports": PORT, "externalTrafficPolicy": "Local"})
    assert "externally-accessible" in found["spec.externalTrafficPolicy"]
    assert (
        spec_of({"type": "NodePort", "ports": PORT, "externalTrafficPolicy": "Local"})[
            "externalTrafficPolicy"
        ]
        == "Local"
    )
    found = causes({"type": "NodePort", "ports": PORT, "externalTrafficPolicy": "Nearest"})
    assert "Unsupported value" in found["spec.externalTrafficPolicy"]


def test_external_name_services() -> None:
    out = spec_of({"type": "ExternalName", "externalName": "db.example.com."})
    assert out == {
        "type": "ExternalName",
        "externalName": "db.example.com.",
        "sessionAffinity": "None",
    }
    found = causes({"type": "ExternalName"})
    assert found["spec.externalName"].startswith("FieldValueRequired")
    found = causes({"type": "ExternalName", "externalName": "not a name", "clusterIP": "None"})
    assert "not a valid DNS name" in found["spec.externalName"]
    assert found["spec.clusterIP"].startswith("FieldValueForbidden")
    found = causes(
        {"type": "ExternalName", "externalName": "x.y", "ports": [{"port": 80, "nodePort": 30080}]}
    )
    assert found["spec.ports[0].nodePort"].startswith("FieldValueForbidden")


def test_ports_and_node_ports() -> None:
    assert causes({"selector": {"a": "b"}})["spec.ports"].startswith("FieldValueRequired")
    assert spec_of({"clusterIP": "None"})["clusterIPs"] == ["None"]  # headless: no ports needed
    found = causes({"ports": [{"port": 80, "nodePort": 30080}]})
    assert 'may not be used when `type` is "ClusterIP"' in found["spec.ports[0].nodePort"]
    ports = [
        {"name": "a", "port": 80, "nodePort": 30080},
        {"name": "b", "port": 80},
        {"name": "c", "port": 81, "nodePort": 30080},
        {"name": "d", "port": 82, "nodePort": 30080, "protocol": "UDP"},
        {"name": "e", "port": 80, "nodePort": 30080, "protocol": "UDP"},
    ]
    found = causes({"type": "NodePort", "ports": ports})
    assert found["spec.ports[1]"].startswith("FieldValueDuplicate")
    assert found["spec.ports[2].nodePort"].startswith("FieldValueDuplicate")
    assert found["spec.ports[3].nodePort"].startswith("FieldValueDuplicate")
    # UDP 80 shares TCP 80's node port, as kube allocates one per port number.
    assert "spec.ports[4].nodePort" not in found
    found = causes({"ports": PORT, "allocateLoadBalancerNodePorts": False})
    assert found["spec.allocateLoadBalancerNodePorts"].startswith("FieldValueForbidden")


def test_cluster_ips_follow_cluster_ip() -> None:
    assert spec_of({"ports": PORT, "clusterIP": "172.30.0.9"})["clusterIPs"] == ["172.30.0.9"]
    assert spec_of({"ports": PORT, "clusterIPs": ["172.30.0.9"]})["clusterIP"] == "172.30.0.9"
    found = causes({"ports": PORT, "clusterIP": "172.30.0.9", "clusterIPs": ["172.30.0.8"]})
    assert "must match spec.clusterIP" in found["spec.clusterIPs[0]"]
    found = causes({"ports": PORT, "clusterIPs": ["172.30.0.9", "fd00::9"]})
    assert "single-stack" in found["spec.clusterIPs"]
    found = causes({"ports": PORT, "ipFamilyPolicy": "RequireDualStack"})
    assert "dual-stack" in found["spec.ipFamilyPolicy"]
    found = causes({"ports": PORT, "externalIPs": ["0.0.0.0", "127.0.0.1", "169.254.1.1", "x"]})
    assert "unspecified" in found["spec.externalIPs[0]"]
    assert "loopback" in found["spec.externalIPs[1]"]
    assert "link-local" in found["spec.externalIPs[2]"]
    assert "not a valid IP" in found["spec.externalIPs[3]"]


# --- updates ---------------------------------------------------------------------------------


def stored(spec: dict[str, Any]) -> dict[str, Any]:
    """A Service as the master stored it (allocated values included)."""
    return validate(K.SERVICE, svc(spec))


NODE_PORT_SVC = {
    "type": "NodePort",
    "clusterIP": "172.30.0.5",
    "ipFamilies": ["IPv4"],
    "ports": [
        {"name": "a", "port": 80, "nodePort": 30080},
        {"name": "b", "port": 81, "nodePort": 30081},
    ],
}


def test_an_update_that_omits_allocated_values_keeps_them() -> None:
    old = stored(NODE_PORT_SVC)
    ports = [{"name": "b", "port": 81}, {"name": "a", "port": 8080}]  # reordered, a changed
    out = spec_of({"type": "NodePort", "ports": ports}, old)
    assert out["clusterIP"] == "172.30.0.5" and out["clusterIPs"] == ["172.30.0.5"]
    assert out["ipFamilies"] == ["IPv4"]
    assert [(p["name"], p["nodePort"]) for p in out["ports"]] == [("b", 30081), ("a", 30080)]
    # A new port does not take an old port's nodePort that another port still uses.
    ports = [{"name": "a", "port": 80, "nodePort": 30081}, {"name": "b", "port": 81}]
    out = spec_of({"type": "NodePort", "ports": ports}, old)
    assert [p.get("nodePort") for p in out["ports"]] == [30081, None]


def test_cluster_ip_is_immutable() -> None:
    old = stored(NODE_PORT_SVC)
    found = causes({**NODE_PORT_SVC, "clusterIP": "172.30.0.6", "clusterIPs": None}, old)
    assert "field is immutable" in found["spec.clusterIP"]
    found = causes({**NODE_PORT_SVC, "clusterIP": "None", "clusterIPs": None}, old)
    assert "field is immutable" in found["spec.clusterIP"]
    headless = stored({"clusterIP": "None", "ports": PORT})
    assert spec_of({"ports": PORT}, headless)["clusterIP"] == "None"


def test_type_changes_drop_what_the_new_type_does_not_use() -> None:
    old = stored(NODE_PORT_SVC)
    # kubectl apply/replace sends the stored values back: unchanged ones are dropped.
    to_cluster_ip = spec_of({**old["spec"], "type": "ClusterIP"}, old)
    assert all("nodePort" not in p for p in to_cluster_ip["ports"])
    assert "externalTrafficPolicy" not in to_cluster_ip
    assert to_cluster_ip["clusterIP"] == "172.30.0.5"
    to_external = spec_of({**old["spec"], "type": "ExternalName", "externalName": "x.y"}, old)
    assert "clusterIP" not in to_external and "clusterIPs" not in to_external
    assert "ipFamilies" not in to_external and "internalTrafficPolicy" not in to_external
    # Changed values are not silently dropped: they are refused.
    changed = {
        **old["spec"],
        "type": "ClusterIP",
        "ports": [{"name": "a", "port": 80, "nodePort": 30090}],
    }
    assert "spec.ports[0].nodePort" in causes(changed, old)
    # From ExternalName, a new clusterIP may be given (it was never set).
    external = stored({"type": "ExternalName", "externalName": "x.y"})
    assert (
        spec_of({"ports": PORT, "clusterIP": "172.30.0.7"}, external)["clusterIP"] == "172.30.0.7"
    )


# --- protobuf (client-go's default for typed objects) ------------------------------------------


def test_protobuf_services_carry_the_policy_fields() -> None:
    from podnet.api.protobuf import SERVICE, decode_message

    affinity = field(1, vfield(1, 600))  # clientIP.timeoutSeconds
    spec = field(1, vfield(3, 80) + field(2, "UDP")) + field(4, "NodePort")
    spec += field(5, "192.0.2.10") + field(7, "ClientIP") + field(11, "Local")
    spec += vfield(13, 1) + field(14, affinity) + field(17, "SingleStack")
    spec += field(19, "IPv4") + field(22, "Local")
    decoded = decode_message(field(1, field(1, "pb")) + field(2, spec), SERVICE)
    out = validate(K.SERVICE, decoded)["spec"]
    assert out["externalIPs"] == ["192.0.2.10"] and out["externalTrafficPolicy"] == "Local"
    assert out["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 600}}
    assert out["publishNotReadyAddresses"] is True and out["internalTrafficPolicy"] == "Local"
    assert out["ipFamilies"] == ["IPv4"] and out["ports"][0]["protocol"] == "UDP"


def test_server_tables_put_age_before_the_wide_columns() -> None:
    from podnet.api.tables import column_definitions, row

    names = [(c["name"], c["priority"]) for c in column_definitions(K.SERVICE)]
    assert names == [
        ("Name", 0), ("Type", 0), ("Cluster-Ip", 0), ("External-Ip", 0), ("Port(S)", 0),
        ("Age", 0), ("Selector", 1),
    ]  # fmt: skip
    obj = validate(K.SERVICE, svc({"ports": PORT, "selector": {"b": "2", "a": "1"}}))
    obj["spec"]["clusterIP"] = "172.30.0.9"
    cells = row(K.SERVICE, obj)["cells"]
    assert cells[:5] == ["web", "ClusterIP", "172.30.0.9", "<none>", "80/TCP"]
    assert cells[6] == "a=1,b=2"
    pods = [c["name"] for c in column_definitions(K.POD)]
    assert pods.index("Age") < pods.index("Ip")  # kubectl: NAME READY STATUS AGE IP NODE
