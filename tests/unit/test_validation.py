"""validate(): metadata, each kind's main errors, defaults, and garbage resistance."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.model import kinds as K
from podnet.model.errors import ApiError
from podnet.model.kinds import Kind
from podnet.model.validation import validate


def errors_of(kind: Kind, obj: Any, old: dict[str, Any] | None = None) -> dict[str, str]:
    """The field -> message map of the 422 that validate() must raise."""
    with pytest.raises(ApiError) as info:
        validate(kind, obj, old)
    assert info.value.code == 422, info.value.message
    assert info.value.reason == "Invalid"
    return {c.field: c.message for c in info.value.causes}


def host_subnet(name: str = "node-1", **fields: Any) -> dict[str, Any]:
    body = {"host": name, "hostIP": "192.168.1.10", "subnet": "10.128.2.0/23"}
    return {"metadata": {"name": name}, **body, **fields}


def pod(**spec: Any) -> dict[str, Any]:
    meta = {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}}
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "nginx"}], **spec}}


def netpol(**spec: Any) -> dict[str, Any]:
    meta = {"name": "allow-web", "namespace": "shop"}
    return {"metadata": meta, "spec": {"podSelector": {}, **spec}}


# --- envelope and metadata ----------------------------------------------------------------


def test_valid_object_gets_type_fields_and_is_a_new_dict() -> None:
    obj = host_subnet()
    out = validate(K.HOST_SUBNET, obj)
    assert out["apiVersion"] == "network.openshift.io/v1"
    assert out["kind"] == "HostSubnet"
    assert out["subnet"] == "10.128.2.0/23"
    out["metadata"]["name"] = "changed"
    assert obj["metadata"]["name"] == "node-1"
    assert "apiVersion" not in obj


def test_non_object_is_bad_request() -> None:
    with pytest.raises(ApiError) as info:
        validate(K.POD, [1, 2])  # type: ignore[arg-type]
    assert info.value.code == 400


def test_wrong_api_version_and_kind_name_the_fields() -> None:
    errs = errors_of(K.HOST_SUBNET, {**host_subnet(), "apiVersion": "v1", "kind": "Pod"})
    assert '"v1" does not match' in errs["apiVersion"]
    assert '"Pod" does not match' in errs["kind"]


def test_error_message_names_field_and_value() -> None:
    with pytest.raises(ApiError) as info:
        validate(K.HOST_SUBNET, host_subnet(subnet="10.1.2.0/33"))
    assert 'subnet: "10.1.2.0/33" is not a valid CIDR' in info.value.message
    assert info.value.status()["details"]["causes"][0]["field"] == "subnet"


def test_all_errors_are_collected() -> None:
    obj = host_subnet(hostIP="300.1.1.1", subnet="10.1.2.1/24", egressIPs=["x"], bogus=1)
    obj["metadata"]["labels"] = {"bad key": "v"}
    errs = errors_of(K.HOST_SUBNET, obj)
    expected = {"hostIP", "subnet", "egressIPs[0]", "bogus", "metadata.labels.bad key"}
    assert set(errs) == expected


def test_unknown_metadata_key() -> None:
    obj = host_subnet()
    obj["metadata"]["colour"] = "red"
    assert errors_of(K.HOST_SUBNET, obj) == {"metadata.colour": "unknown field"}


def test_name_required_unless_generate_name() -> None:
    obj = pod()
    del obj["metadata"]["name"]
    assert "Required value" in errors_of(K.POD, obj)["metadata.name"]
    obj["metadata"]["generateName"] = "web-"
    assert validate(K.POD, obj)["metadata"]["generateName"] == "web-"


@pytest.mark.parametrize("name", ["Web", "web_1", "-web", "web.", "a" * 254, ""])
def test_bad_subdomain_names(name: str) -> None:
    obj = pod()
    obj["metadata"]["name"] = name
    assert "metadata.name" in errors_of(K.POD, obj)


def test_namespace_name_is_a_label_and_cluster_scoped_kinds_refuse_namespace() -> None:
    errs = errors_of(K.NAMESPACE, {"metadata": {"name": "a.b", "namespace": "x"}})
    assert "DNS-1123 label" in errs["metadata.name"]
    assert "cluster-scoped" in errs["metadata.namespace"]
    assert validate(K.NAMESPACE, {"metadata": {"name": "a" * 63}})["metadata"]["name"]
    assert "63" in errors_of(K.NAMESPACE, {"metadata": {"name": "a" * 64}})["metadata.name"]


def test_namespaced_object_namespace_must_be_a_label() -> None:
    obj = pod()
    obj["metadata"]["namespace"] = "Shop"
    assert "metadata.namespace" in errors_of(K.POD, obj)


def test_service_name_is_a_dns1035_label() -> None:
    obj = {"metadata": {"name": "1svc"}, "spec": {"ports": [{"port": 80}]}}
    assert "DNS-1035" in errors_of(K.SERVICE, obj)["metadata.name"]


def test_labels_and_annotations() -> None:
    obj = pod()
    labels = {"example.com/tier": "", "x/y/z": "a", "k": "v" * 64, "n": 5}
    obj["metadata"]["labels"] = labels
    obj["metadata"]["annotations"] = {"note": "x" * (256 * 1024)}
    errs = errors_of(K.POD, obj)
    assert "not a valid label key" in errs["metadata.labels.x/y/z"]
    assert "63" in errs["metadata.labels.k"]
    assert "must be of type string, got integer" in errs["metadata.labels.n"]
    assert "262144" in errs["metadata.annotations"]
    assert "metadata.labels.example.com/tier" not in errs


def test_metadata_null_keys_are_dropped() -> None:
    obj = pod()
    obj["metadata"].update(creationTimestamp=None, labels=None)
    assert validate(K.POD, obj)["metadata"] == {"name": "web-1", "namespace": "shop"}


def test_metadata_must_be_an_object() -> None:
    errs = errors_of(K.POD, {"metadata": "web", "spec": {}})
    assert errs == {"metadata": "must be of type object, got string"}


def test_owner_references_are_typed() -> None:
    obj = pod()
    obj["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "r", "uid": 1}]
    errs = errors_of(K.POD, obj)
    assert errs["metadata.ownerReferences[0].apiVersion"] == "Required value"
    assert "integer" in errs["metadata.ownerReferences[0].uid"]


def test_unknown_top_level_field() -> None:
    assert errors_of(K.POD, {**pod(), "spek": {}}) == {"spek": "unknown field"}


# --- core kinds -----------------------------------------------------------------------------


def test_pod_allows_unknown_spec_fields_and_defaults_port_protocol() -> None:
    obj = pod(volumes=[{"name": "v"}], nodeName="node-1")
    obj["spec"]["containers"][0]["ports"] = [{"containerPort": 80}]
    out = validate(K.POD, obj)
    assert out["spec"]["volumes"] == [{"name": "v"}]
    assert out["spec"]["containers"][0]["ports"][0]["protocol"] == "TCP"


def test_pod_main_errors() -> None:
    obj = pod(nodeName=7, containers=[{"image": "x", "ports": [{"containerPort": 0}]}])
    obj["status"] = {"podIP": "10.1.1.x", "podIPs": "10.1.1.1", "phase": 1}
    errs = errors_of(K.POD, obj)
    assert errs["spec.nodeName"] == "must be of type string, got integer"
    assert errs["spec.containers[0].name"] == "Required value"
    assert "between 1 and 65535" in errs["spec.containers[0].ports[0].containerPort"]
    assert '"10.1.1.x" is not a valid IP address' in errs["status.podIP"]
    assert "array" in errs["status.podIPs"]
    assert "string" in errs["status.phase"]


def test_pod_ipv6_address_is_fine() -> None:
    obj = {**pod(), "status": {"podIP": "fd00::5", "podIPs": [{"ip": "fd00::5"}]}}
    assert validate(K.POD, obj)["status"]["podIP"] == "fd00::5"


def test_service_defaults_and_errors() -> None:
    spec = {"ports": [{"name": "http", "port": 80}], "selector": {"app": "web"}}
    out = validate(K.SERVICE, {"metadata": {"name": "web"}, "spec": spec})
    assert out["spec"]["type"] == "ClusterIP"
    assert out["spec"]["ports"][0] == {
        "name": "http",
        "protocol": "TCP",
        "port": 80,
        "targetPort": 80,
    }
    bad = {"ports": [{"port": "80"}, {"port": 81, "targetPort": True}], "type": "Magic"}
    errs = errors_of(K.SERVICE, {"metadata": {"name": "web"}, "spec": bad})
    assert "integer" in errs["spec.ports[0].port"]
    assert "got boolean" in errs["spec.ports[1].targetPort"]
    assert 'Unsupported value: "Magic"' in errs["spec.type"]


def test_service_port_names_required_and_unique() -> None:
    ports = [{"name": "a", "port": 80}, {"name": "a", "port": 81}, {"port": 82}]
    errs = errors_of(K.SERVICE, {"metadata": {"name": "web"}, "spec": {"ports": ports}})
    assert "Duplicate" in errs["spec.ports[1].name"]
    assert "Required" in errs["spec.ports[2].name"]


def test_service_cluster_ip_forms() -> None:
    ports = [{"port": 80}]
    for ip in ("None", "", "172.30.0.10"):
        spec = {"clusterIP": ip, "ports": ports}
        validate(K.SERVICE, {"metadata": {"name": "web"}, "spec": spec})
    errs = errors_of(K.SERVICE, {"metadata": {"name": "web"}, "spec": {"clusterIP": "x"}})
    assert "spec.clusterIP" in errs


def test_node_fields() -> None:
    status = {
        "addresses": [{"type": "InternalIP"}],
        "conditions": [{"type": "Ready", "status": "Yes"}],
    }
    spec = {"podCIDR": "10.0.0.0/33", "unschedulable": "no"}
    errs = errors_of(K.NODE, {"metadata": {"name": "n1"}, "spec": spec, "status": status})
    assert errs["status.addresses[0].address"] == "Required value"
    assert "Unsupported value" in errs["status.conditions[0].status"]
    assert "not a valid CIDR" in errs["spec.podCIDR"]
    assert "boolean" in errs["spec.unschedulable"]


def test_endpoints_fields() -> None:
    subsets = [{"addresses": [{"ip": "10.1.0.5", "nodeName": "n1"}], "ports": [{"port": 8080}]}]
    out = validate(K.ENDPOINTS, {"metadata": {"name": "web"}, "subsets": subsets})
    assert out["subsets"][0]["ports"][0]["protocol"] == "TCP"
    bad = [{"addresses": [{"ip": "nope"}], "notReadyAddresses": [{}], "ports": [{"port": -1}]}]
    errs = errors_of(K.ENDPOINTS, {"metadata": {"name": "web"}, "subsets": bad})
    assert set(errs) == {
        "subsets[0].addresses[0].ip",
        "subsets[0].notReadyAddresses[0].ip",
        "subsets[0].ports[0].port",
    }


def test_event_is_permissive_but_metadata_is_checked() -> None:
    obj = {"metadata": {"name": "web.1", "namespace": "shop"}, "reason": "Started", "count": 2}
    assert validate(K.EVENT, obj)["count"] == 2
    assert "metadata.name" in errors_of(K.EVENT, {"metadata": {"name": "Bad"}})


# --- network kinds --------------------------------------------------------------------------


def test_host_subnet_main_errors() -> None:
    obj = host_subnet(host="node-2", hostIP="fd00::1", subnet="10.128.2.0/22")
    obj["egressCIDRs"] = ["10.0.0.0/8", "10.0.0.1/8"]
    errs = errors_of(K.HOST_SUBNET, obj)
    assert 'must equal metadata.name "node-1"' in errs["host"]
    assert "IPv4" in errs["hostIP"]
    assert "host bits are set (did you mean 10.128.0.0/22?)" in errs["subnet"]
    assert "egressCIDRs[1]" in errs
    assert errors_of(K.HOST_SUBNET, {"metadata": {"name": "n"}})["hostIP"] == "Required value"


def test_host_subnet_subnet_required_unless_assign_annotation() -> None:
    obj = host_subnet()
    del obj["subnet"]
    assert "Required value" in errors_of(K.HOST_SUBNET, obj)["subnet"]
    obj["metadata"]["annotations"] = {"pod.network.openshift.io/assign-subnet": "true"}
    assert "subnet" not in validate(K.HOST_SUBNET, obj)


def test_host_subnet_update_rules() -> None:
    old = validate(K.HOST_SUBNET, host_subnet())
    moved = errors_of(K.HOST_SUBNET, host_subnet(subnet="10.128.4.0/23"), old)
    assert moved == {"subnet": 'may not change (was "10.128.2.0/23")'}
    updated = validate(K.HOST_SUBNET, host_subnet(hostIP="192.168.1.11"), old)
    assert updated["hostIP"] == "192.168.1.11"
    pending = {**old, "subnet": ""}
    assert validate(K.HOST_SUBNET, host_subnet(), pending)["subnet"] == "10.128.2.0/23"


def test_net_namespace() -> None:
    obj = {"metadata": {"name": "shop"}, "netname": "shop", "netid": 12}
    assert validate(K.NET_NAMESPACE, obj)["netid"] == 12
    errs = errors_of(K.NET_NAMESPACE, {**obj, "netname": "other", "netid": 1 << 24})
    assert "metadata.name" in errs["netname"]
    assert "between 0 and 16777215" in errs["netid"]
    assert "boolean" in errors_of(K.NET_NAMESPACE, {**obj, "netid": True})["netid"]
    assert validate(K.NET_NAMESPACE, {**obj, "netid": 0})["netid"] == 0
    assert validate(K.NET_NAMESPACE, {**obj, "netid": 10})["netid"] == 10
    for reserved in range(1, 10):
        errs = errors_of(K.NET_NAMESPACE, {**obj, "netid": reserved})
        assert f"{reserved} is reserved: must be 0 or at least 10" in errs["netid"]


def test_egress_network_policy() -> None:
    rules = [
        {"type": "Allow", "to": {"dnsName": "www.example.com"}},
        {"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"}},
    ]
    obj = {"metadata": {"name": "default", "namespace": "shop"}, "spec": {"egress": rules}}
    assert validate(K.EGRESS_NETWORK_POLICY, obj)["spec"]["egress"] == rules
    bad = [{"type": "Drop", "to": {"cidrSelector": "1.2.3.0/24", "dnsName": "a.com"}}, {"to": {}}]
    errs = errors_of(K.EGRESS_NETWORK_POLICY, {**obj, "spec": {"egress": bad}})
    assert 'Unsupported value: "Drop"' in errs["spec.egress[0].type"]
    assert "exactly one" in errs["spec.egress[0].to"]
    assert errs["spec.egress[1].type"] == "Required value"
    many = {"egress": [rules[0]] * 1001}
    assert (
        "at most 1000" in errors_of(K.EGRESS_NETWORK_POLICY, {**obj, "spec": many})["spec.egress"]
    )


# --- NetworkPolicy --------------------------------------------------------------------------


def test_network_policy_defaults() -> None:
    out = validate(K.NETWORK_POLICY, netpol(ingress=[{"ports": [{"port": 80}]}]))
    assert out["spec"]["policyTypes"] == ["Ingress"]
    assert out["spec"]["ingress"][0]["ports"][0] == {"protocol": "TCP", "port": 80}
    out = validate(K.NETWORK_POLICY, netpol(egress=[{"to": [{"podSelector": {}}]}]))
    assert out["spec"]["policyTypes"] == ["Ingress", "Egress"]
    out = validate(K.NETWORK_POLICY, netpol(policyTypes=["Egress"]))
    assert out["spec"]["policyTypes"] == ["Egress"]


def test_network_policy_full_shape_round_trips() -> None:
    peer = {
        "namespaceSelector": {"matchLabels": {"team": "a"}},
        "podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]},
    }
    block = {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}
    port = {"protocol": "UDP", "port": 5000, "endPort": 5100}
    spec = {"ingress": [{"from": [peer, block], "ports": [port]}], "policyTypes": ["Ingress"]}
    out = validate(K.NETWORK_POLICY, netpol(**spec))
    assert out["spec"]["ingress"] == spec["ingress"]
    assert validate(K.NETWORK_POLICY, out) == out


def test_network_policy_errors_name_the_field() -> None:
    ingress = [
        {
            "from": [
                {},
                {"ipBlock": {"cidr": "10.0.0.0/16"}, "podSelector": {}},
            ],
            "ports": [{"port": 80}, {"port": 70000}, {"port": "http", "endPort": 90}],
        }
    ]
    expressions = [
        {"key": "a", "operator": "In"},
        {"key": "b", "operator": "Exists", "values": ["x"]},
    ]
    spec = {
        "ingress": ingress,
        "podSelector": {"matchExpressions": expressions},
        "policyTypes": ["In"],
    }
    errs = errors_of(K.NETWORK_POLICY, netpol(**spec))
    assert "must specify" in errs["spec.ingress[0].from[0]"]
    assert "may not be combined" in errs["spec.ingress[0].from[1].ipBlock"]
    assert "between 1 and 65535" in errs["spec.ingress[0].ports[1].port"]
    assert "port is a number" in errs["spec.ingress[0].ports[2].endPort"]
    assert "non-empty" in errs["spec.podSelector.matchExpressions[0].values"]
    assert "must be empty" in errs["spec.podSelector.matchExpressions[1].values"]
    assert "Unsupported value" in errs["spec.policyTypes[0]"]


def test_network_policy_ip_block_and_ports() -> None:
    block = {
        "ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24", "10.2.0.0/24", "10.0.0.0/16"]}
    }
    ports = [{"port": 90, "endPort": 80}, {"port": "http-alt"}, {"port": "Bad_Name"}]
    errs = errors_of(K.NETWORK_POLICY, netpol(egress=[{"to": [block], "ports": ports}]))
    assert "except[0]" not in " ".join(errs)
    assert "strict subset" in errs["spec.egress[0].to[0].ipBlock.except[1]"]
    assert "strict subset" in errs["spec.egress[0].to[0].ipBlock.except[2]"]
    assert "between port 90" in errs["spec.egress[0].ports[0].endPort"]
    assert "not a valid port name" in errs["spec.egress[0].ports[2].port"]


def test_network_policy_requires_pod_selector_and_closes_unknown_fields() -> None:
    obj = {"metadata": {"name": "p", "namespace": "shop"}, "spec": {"ingres": []}}
    errs = errors_of(K.NETWORK_POLICY, obj)
    assert errs == {"spec.podSelector": "Required value", "spec.ingres": "unknown field"}
    errs = errors_of(K.NETWORK_POLICY, netpol(ingress=[{"from_": []}]))
    assert errs == {"spec.ingress[0].from_": "unknown field"}


# --- properties -----------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
FIELD_NAMES = [
    "metadata", "spec", "status", "host", "hostIP", "subnet", "egressIPs", "netid", "netname",
    "clusterNetworks", "serviceNetwork", "subsets", "name", "labels", "ports", "ingress",
    "egress", "podSelector", "from", "to", "ipBlock", "cidr", "except", "port", "endPort",
]  # fmt: skip
keys = st.sampled_from(FIELD_NAMES) | st.text(max_size=10)
json_objects = st.recursive(
    st.dictionaries(keys, json_scalars, max_size=5),
    lambda inner: st.dictionaries(
        keys, inner | st.lists(inner, max_size=3) | json_scalars, max_size=5
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(K.ALL_KINDS), obj=json_values | json_objects)
def test_garbage_only_ever_raises_api_error(kind: Kind, obj: Any) -> None:
    try:
        out = validate(kind, obj)
    except ApiError as exc:
        assert exc.code in (400, 422)
        assert all(c.field and c.message for c in exc.causes)
    else:
        assert validate(kind, out) == out


VALID: dict[str, dict[str, Any]] = {
    "HostSubnet": host_subnet(egressIPs=["192.168.1.50"]),
    "Pod": pod(nodeName="n1"),
    "NetworkPolicy": netpol(
        ingress=[{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 80}]}]
    ),
    "ClusterNetwork": {
        "metadata": {"name": "default"},
        "clusterNetworks": [{"CIDR": "10.128.0.0/14", "hostSubnetLength": 9}],
        "serviceNetwork": "172.30.0.0/16",
    },
}


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(VALID)), data=st.data(), junk=json_values)
def test_mutated_valid_objects_only_raise_api_error(name: str, data: Any, junk: Any) -> None:
    obj = copy.deepcopy(VALID[name])
    path = data.draw(st.sampled_from(_paths(obj)[1:]))
    node = obj
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = junk
    try:
        validate(K.KINDS.by_name(name.lower()), obj)  # type: ignore[arg-type]
    except ApiError as exc:
        assert exc.code == 422
        assert exc.causes


octets = st.integers(0, 255)
ipv4 = st.tuples(octets, octets, octets, octets).map(lambda t: ".".join(map(str, t)))
dns_labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)


@st.composite
def host_subnets(draw: st.DrawFn) -> dict[str, Any]:
    name = ".".join(draw(st.lists(dns_labels, min_size=1, max_size=3)))
    prefix = draw(st.integers(8, 30))
    network = draw(st.integers(0, (1 << prefix) - 1)) << (32 - prefix)
    subnet = ".".join(str((network >> s) & 255) for s in (24, 16, 8, 0)) + f"/{prefix}"
    obj = {
        "apiVersion": "network.openshift.io/v1",
        "kind": "HostSubnet",
        "metadata": {"name": name},
    }
    obj |= {"host": name, "hostIP": draw(ipv4), "subnet": subnet}
    if draw(st.booleans()):
        obj["egressIPs"] = draw(st.lists(ipv4, max_size=3))
    return obj


@settings(max_examples=200, deadline=None)
@given(obj=host_subnets())
def test_valid_host_subnets_round_trip(obj: dict[str, Any]) -> None:
    out = validate(K.HOST_SUBNET, obj)
    assert out == obj
    assert validate(K.HOST_SUBNET, out, old=out) == obj


def test_service_port_name_is_a_dns_label_as_in_kube() -> None:
    """kubectl create service clusterip x --tcp=80:8080 names its port "80-8080"."""
    from podnet.model.schemas_service import ServicePort

    assert ServicePort(name="80-8080", port=80).name == "80-8080"
    assert ServicePort(name="", port=80).name == ""
    for bad in ("Web", "web_", "-web", "a" * 64):
        with pytest.raises(ValueError, match="DNS-1123 label"):
            ServicePort(name=bad, port=80)
