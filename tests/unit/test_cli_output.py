"""Table, age, name and describe rendering of the CLI (pure functions, no server)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from podnet.cli import output
from podnet.model.kinds import CLUSTER_NETWORK, EVENT, HOST_SUBNET, NET_NAMESPACE, NODE, POD

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def ts(delta: timedelta) -> str:
    return (NOW - delta).strftime("%Y-%m-%dT%H:%M:%SZ")


def hostsubnet(name: str, ip: str, subnet: str, age: timedelta, **extra: object) -> dict:
    return {
        "metadata": {"name": name, "creationTimestamp": ts(age)},
        "host": name,
        "hostIP": ip,
        "subnet": subnet,
        **extra,
    }


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (5, "5s"),
        (119, "119s"),
        (180, "3m"),
        (200, "3m20s"),
        (600, "10m"),
        (7200, "120m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 60 * 5, "3h5m"),
        (10 * 3600, "10h"),
        (4 * 86400, "4d"),
        (4 * 86400 + 3600, "4d1h"),
        (30 * 86400, "30d"),
        (3 * 365 * 86400, "3y"),
        (10 * 365 * 86400, "10y"),
        (-1, "0s"),
        (-5, "<invalid>"),
    ],
)
def test_human_duration_matches_kubectl(seconds: int, text: str) -> None:
    assert output.human_duration(seconds) == text


def test_age_of_missing_or_bad_timestamp_is_unknown() -> None:
    assert output.age(None, NOW) == "<unknown>"
    assert output.age("yesterday", NOW) == "<unknown>"
    assert output.age(ts(timedelta(hours=2)), NOW) == "120m"
    assert output.age("2024-05-01T11:59:55+00:00", NOW) == "5s"


def test_hostsubnet_table_is_kubectl_shaped() -> None:
    objs = [
        hostsubnet("node1", "192.168.50.11", "10.128.0.0/23", timedelta(seconds=5)),
        hostsubnet("node-two", "192.168.50.12", "10.128.2.0/23", timedelta(days=4)),
    ]
    text = output.render_table(HOST_SUBNET, objs, NOW)
    assert text.splitlines() == [
        "NAME       HOST       HOST IP         SUBNET          AGE",
        "node1      node1      192.168.50.11   10.128.0.0/23   5s",
        "node-two   node-two   192.168.50.12   10.128.2.0/23   4d",
    ]


def test_wide_adds_wide_only_columns_after_age_and_none_for_empty() -> None:
    obj = hostsubnet(
        "n1",
        "10.0.0.1",
        "10.128.0.0/23",
        timedelta(minutes=3),
        egressIPs=["10.0.0.50", "10.0.0.51"],
    )
    lines = output.render_table(HOST_SUBNET, [obj], NOW, wide=True).splitlines()
    assert lines == [
        "NAME   HOST   HOST IP    SUBNET          AGE   EGRESS CIDRS   EGRESS IPS",
        "n1     n1     10.0.0.1   10.128.0.0/23   3m    <none>         10.0.0.50,10.0.0.51",
    ]
    assert not any(line.endswith(" ") for line in lines)


def test_netnamespaces_table_and_netid_zero_is_shown() -> None:
    objs = [
        {
            "metadata": {"name": "default", "creationTimestamp": ts(timedelta(hours=2))},
            "netname": "default",
            "netid": 0,
        },
        {"metadata": {"name": "a"}, "netname": "a", "netid": 12},
    ]
    assert output.render_table(NET_NAMESPACE, objs, NOW).splitlines() == [
        "NAME      NETID   AGE",
        "default   0       120m",
        "a         12      <unknown>",
    ]


def test_all_namespaces_puts_namespace_column_first() -> None:
    pod = {
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "creationTimestamp": ts(timedelta(seconds=30)),
        },
        "status": {"phase": "Running"},
    }
    lines = output.render_table(POD, [pod], NOW, all_namespaces=True).splitlines()
    assert lines == [
        "NAMESPACE   NAME   READY   STATUS    AGE",
        "shop        web    1/1     Running   30s",
    ]
    # Cluster-scoped kinds never get a NAMESPACE column.
    assert output.table_headers(HOST_SUBNET, all_namespaces=True)[0] == "NAME"


def test_events_have_no_age_column_and_humanised_last_seen() -> None:
    event = {
        "lastTimestamp": ts(timedelta(minutes=3)),
        "type": "Warning",
        "reason": "NoSubnet",
        "involvedObject": {"kind": "Node", "name": "n1"},
        "message": "no subnets\navailable",
    }
    lines = output.render_table(EVENT, [event], NOW).splitlines()
    assert lines[0] == "LAST SEEN   TYPE      REASON     OBJECT    MESSAGE"
    assert lines[1] == "3m          Warning   NoSubnet   node/n1   no subnets available"


def test_table_stream_keeps_first_widths_for_later_rows() -> None:
    stream = output.TableStream(["NAME", "NETID"])
    assert stream.start([["abc", "10"]]) == ["NAME   NETID", "abc    10"]
    assert stream.line(["a", "11"]) == "a      11"
    assert stream.line(["much-longer", "12"]) == "much-longer   12"


def test_object_name_and_typed_list() -> None:
    obj = {"metadata": {"name": "node1"}}
    assert output.object_name(HOST_SUBNET, obj) == "hostsubnet.network.openshift.io/node1"
    assert output.object_name(POD, {"metadata": {"name": "web"}}) == "pod/web"
    listing = output.as_list(HOST_SUBNET, [obj])
    assert listing["kind"] == "List"
    assert listing["items"][0]["apiVersion"] == "network.openshift.io/v1"
    assert listing["items"][0]["kind"] == "HostSubnet"
    assert output.to_yaml({"b": 1, "a": [1]}) == "b: 1\na:\n- 1"


def test_field_labels() -> None:
    assert output.field_label("hostIP") == "Host IP"
    assert output.field_label("egressCIDRs") == "Egress CIDRs"
    assert output.field_label("hostSubnetLength") == "Host Subnet Length"


def test_describe_hostsubnet() -> None:
    obj = hostsubnet("node1", "192.168.50.11", "10.128.0.0/23", timedelta(minutes=3))
    obj["metadata"]["labels"] = {"zone": "a", "rack": "r1"}
    obj["egressIPs"] = []
    text = output.describe(
        HOST_SUBNET, {"apiVersion": "network.openshift.io/v1", "kind": "HostSubnet", **obj}, NOW
    )
    assert text.splitlines() == [
        "Name:               node1",
        "Labels:             rack=r1",
        "                    zone=a",
        "Annotations:        <none>",
        f"CreationTimestamp:  {ts(timedelta(minutes=3))} (3m ago)",
        "Host:               node1",
        "Host IP:            192.168.50.11",
        "Subnet:             10.128.0.0/23",
        "Egress IPs:         <none>",
    ]


def test_describe_nested_body_and_lists() -> None:
    obj = {
        "metadata": {"name": "default"},
        "clusterNetworks": [
            {"CIDR": "10.128.0.0/14", "hostSubnetLength": 9},
            {"CIDR": "10.132.0.0/14", "hostSubnetLength": 9},
        ],
        "serviceNetwork": "172.30.0.0/16",
    }
    lines = output.describe(CLUSTER_NETWORK, obj, NOW).splitlines()
    body = lines[lines.index("Cluster Networks:") :]
    assert body == [
        "Cluster Networks:",
        "  - CIDR:                10.128.0.0/14",
        "    Host Subnet Length:  9",
        "  - CIDR:                10.132.0.0/14",
        "    Host Subnet Length:  9",
        "Service Network:    172.30.0.0/16",
    ]


def test_describe_node_shows_conditions_table() -> None:
    node = {
        "metadata": {"name": "n1", "namespace": None},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "192.168.50.11"}],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "AgentReady",
                    "lastHeartbeatTime": "2024-05-01T11:59:00Z",
                }
            ],
        },
    }
    lines = output.describe(NODE, node, NOW).splitlines()
    assert "Namespace:" not in "\n".join(lines)
    at = lines.index("Conditions:")
    assert lines[at + 1].split() == [
        "Type",
        "Status",
        "LastHeartbeatTime",
        "LastTransitionTime",
        "Reason",
        "Message",
    ]
    assert lines[at + 3].split() == [
        "Ready",
        "True",
        "2024-05-01T11:59:00Z",
        "<none>",
        "AgentReady",
        "<none>",
    ]
    assert lines[3] == "CreationTimestamp:  <unknown>"
    assert lines[at - 3 : at] == [
        "  Addresses:",
        "    - Type:     InternalIP",
        "      Address:  192.168.50.11",
    ]
    assert not any("conditions" in line.lower() and "Type" in line for line in lines[:at])


def test_describe_namespaced_shows_namespace_and_annotations() -> None:
    pod = {
        "metadata": {"name": "web", "namespace": "shop", "annotations": {"a/b": "c"}},
        "spec": {"nodeName": "n1"},
    }
    lines = output.describe(POD, pod, NOW).splitlines()
    assert lines[1] == "Namespace:          shop"
    assert lines[3] == "Annotations:        a/b: c"
    assert lines[-2:] == ["Spec:", "  Node Name:  n1"]
