"""ClusterNetwork: field rules on create, and every change rule on update."""

from __future__ import annotations

from typing import Any

import pytest

from podnet.model.errors import ApiError
from podnet.model.kinds import CLUSTER_NETWORK
from podnet.model.validation import validate


def cluster_network(*entries: tuple[str, int], **fields: Any) -> dict[str, Any]:
    networks = [{"CIDR": cidr, "hostSubnetLength": length} for cidr, length in entries]
    body: dict[str, Any] = {
        "clusterNetworks": networks or [{"CIDR": "10.128.0.0/14", "hostSubnetLength": 9}]
    }
    body["serviceNetwork"] = "172.30.0.0/16"
    return {"metadata": {"name": "default"}, **body, **fields}


def errors_of(obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, str]:
    with pytest.raises(ApiError) as info:
        validate(CLUSTER_NETWORK, obj, old)
    assert info.value.code == 422
    return {c.field: c.message for c in info.value.causes}


@pytest.fixture
def stored() -> dict[str, Any]:
    """The ClusterNetwork as first stored: 10.128.0.0/14, /23 per node, VXLAN 4789."""
    return validate(CLUSTER_NETWORK, cluster_network(pluginName="redhat/openshift-ovs-subnet"))


# --- create ---------------------------------------------------------------------------------


def test_defaults_are_applied() -> None:
    out = validate(CLUSTER_NETWORK, cluster_network())
    assert out["vxlanPort"] == 4789
    assert out["mtu"] == 1450
    assert out["pluginName"] == "redhat/openshift-ovs-subnet"
    assert out["apiVersion"] == "network.openshift.io/v1"


def test_only_name_default_is_allowed() -> None:
    obj = cluster_network()
    obj["metadata"]["name"] = "other"
    assert 'must be "default"' in errors_of(obj)["metadata.name"]


def test_cluster_networks_required_and_non_empty() -> None:
    obj = cluster_network()
    del obj["clusterNetworks"]
    assert errors_of(obj) == {"clusterNetworks": "Required value"}
    obj["clusterNetworks"] = []
    assert "at least one" in errors_of(obj)["clusterNetworks"]


@pytest.mark.parametrize(
    ("cidr", "why"),
    [
        ("10.128.0.0/33", "not a valid CIDR"),
        ("10.128.0.1/14", "host bits are set (did you mean 10.128.0.0/14?)"),
        ("fd00::/48", "not an IPv4 CIDR"),
        ("10.128.0.0", "not a valid CIDR"),
        ("10.128.0.0/255.252.0.0", "not a valid CIDR"),
    ],
)
def test_bad_cidr(cidr: str, why: str) -> None:
    assert why in errors_of(cluster_network((cidr, 9)))["clusterNetworks[0].CIDR"]


@pytest.mark.parametrize(("length", "ok"), [(1, False), (2, True), (18, True), (19, False)])
def test_host_subnet_length_range(length: int, ok: bool) -> None:
    obj = cluster_network(("10.128.0.0/14", length))
    if ok:
        assert validate(CLUSTER_NETWORK, obj)["clusterNetworks"][0]["hostSubnetLength"] == length
    else:
        message = errors_of(obj)["clusterNetworks[0].hostSubnetLength"]
        assert "must be between 2 and 18" in message


def test_host_subnet_length_must_be_an_integer() -> None:
    errs = errors_of(cluster_network(("10.128.0.0/14", "9")))  # type: ignore[arg-type]
    assert errs == {"clusterNetworks[0].hostSubnetLength": "must be of type integer, got string"}


def test_entries_may_not_overlap_each_other() -> None:
    errs = errors_of(cluster_network(("10.128.0.0/14", 9), ("10.129.0.0/16", 8)))
    assert "overlaps clusterNetworks[0].CIDR 10.128.0.0/14" in errs["clusterNetworks[1].CIDR"]


def test_entries_may_not_overlap_the_service_network() -> None:
    errs = errors_of(cluster_network(("172.30.0.0/15", 9)))
    assert "overlaps clusterNetworks[0].CIDR" in errs["serviceNetwork"]


def test_service_network_required_and_valid() -> None:
    obj = cluster_network()
    del obj["serviceNetwork"]
    assert errors_of(obj) == {"serviceNetwork": "Required value"}
    assert "serviceNetwork" in errors_of(cluster_network(serviceNetwork="172.30.0.1/16"))


def test_plugin_vxlan_port_and_mtu_ranges() -> None:
    errs = errors_of(cluster_network(pluginName="flannel", vxlanPort=0, mtu=9999999))
    assert 'Unsupported value: "flannel"' in errs["pluginName"]
    assert "between 1 and 65535" in errs["vxlanPort"]
    assert "between 576 and 65000" in errs["mtu"]
    assert "boolean" in errors_of(cluster_network(mtu=True))["mtu"]


def test_legacy_fields_must_match_the_first_entry() -> None:
    good = cluster_network(network="10.128.0.0/14", hostsubnetlength=9)
    assert validate(CLUSTER_NETWORK, good)["network"] == "10.128.0.0/14"
    errs = errors_of(cluster_network(network="10.0.0.0/14", hostsubnetlength=8))
    assert "must match clusterNetworks[0].CIDR" in errs["network"]
    assert "must match clusterNetworks[0].hostSubnetLength 9" in errs["hostsubnetlength"]


def test_unknown_field_is_refused() -> None:
    assert errors_of(cluster_network(spec={})) == {"spec": "unknown field"}


# --- change rules ---------------------------------------------------------------------------


def test_unchanged_update_is_fine(stored: dict[str, Any]) -> None:
    assert validate(CLUSTER_NETWORK, stored, stored) == stored


def test_may_grow_to_a_superset(stored: dict[str, Any]) -> None:
    grown = cluster_network(("10.128.0.0/13", 9))
    assert validate(CLUSTER_NETWORK, grown, stored)["clusterNetworks"][0]["CIDR"] == "10.128.0.0/13"


def test_may_add_an_entry(stored: dict[str, Any]) -> None:
    more = cluster_network(("10.128.0.0/14", 9), ("10.200.0.0/16", 8))
    assert len(validate(CLUSTER_NETWORK, more, stored)["clusterNetworks"]) == 2


def test_may_not_shrink(stored: dict[str, Any]) -> None:
    errs = errors_of(cluster_network(("10.128.0.0/15", 9)), stored)
    assert errs == {"clusterNetworks[0].CIDR": "may only grow to a superset of 10.128.0.0/14"}


def test_may_not_move(stored: dict[str, Any]) -> None:
    errs = errors_of(cluster_network(("10.0.0.0/14", 9)), stored)
    assert errs == {"clusterNetworks[0].CIDR": "may only grow to a superset of 10.128.0.0/14"}


def test_may_not_replace_by_a_disjoint_list(stored: dict[str, Any]) -> None:
    errs = errors_of(cluster_network(("10.0.0.0/16", 8), ("10.1.0.0/16", 8)), stored)
    assert errs == {"clusterNetworks[0].CIDR": "may only grow to a superset of 10.128.0.0/14"}


def test_may_not_remove_an_entry() -> None:
    two = validate(CLUSTER_NETWORK, cluster_network(("10.128.0.0/14", 9), ("10.200.0.0/16", 8)))
    errs = errors_of(cluster_network(("10.128.0.0/14", 9)), two)
    assert "may not remove 10.200.0.0/16" in errs["clusterNetworks"]


def test_host_subnet_length_of_a_kept_entry_is_fixed(stored: dict[str, Any]) -> None:
    errs = errors_of(cluster_network(("10.128.0.0/13", 8)), stored)
    assert errs == {
        "clusterNetworks[0].hostSubnetLength": "may not change (was 9 for 10.128.0.0/14)"
    }


def test_service_network_is_fixed(stored: dict[str, Any]) -> None:
    errs = errors_of(cluster_network(serviceNetwork="172.31.0.0/16"), stored)
    assert errs == {"serviceNetwork": "may not change (was 172.30.0.0/16)"}


def test_vxlan_port_is_fixed_even_when_left_out(stored: dict[str, Any]) -> None:
    assert errors_of(cluster_network(vxlanPort=4790), stored) == {
        "vxlanPort": "may not change (was 4789)"
    }
    custom = {**stored, "vxlanPort": 8472}
    assert errors_of(cluster_network(), custom) == {"vxlanPort": "may not change (was 8472)"}


def test_plugin_name_and_mtu_may_change(stored: dict[str, Any]) -> None:
    changed = cluster_network(pluginName="redhat/openshift-ovs-networkpolicy", mtu=1400)
    out = validate(CLUSTER_NETWORK, changed, stored)
    assert out["pluginName"] == "redhat/openshift-ovs-networkpolicy"
    assert out["mtu"] == 1400


def test_all_change_errors_are_reported_together(stored: dict[str, Any]) -> None:
    obj = cluster_network(("10.128.0.0/15", 9), serviceNetwork="172.31.0.0/16", vxlanPort=1)
    assert set(errors_of(obj, stored)) == {"clusterNetworks[0].CIDR", "serviceNetwork", "vxlanPort"}


def test_malformed_old_object_does_not_crash() -> None:
    old = {"clusterNetworks": [{"CIDR": 5}, "x", {"CIDR": "nope"}], "serviceNetwork": None}
    assert validate(CLUSTER_NETWORK, cluster_network(), old)["vxlanPort"] == 4789
