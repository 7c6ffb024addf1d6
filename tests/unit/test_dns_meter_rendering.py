"""The DNS's per-source UDP rate in the node's inet table (pure rendering and comparison;
the kernel's side is ``tests/integration/test_dns_kernel_meter.py``)."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from podnet.agent.config import AgentConfig, node_network
from podnet.dataplane.interface import NodeNetwork
from podnet.dataplane.linux import nftables
from podnet.dataplane.linux.nftrules import DNS_CLIENTS_SET, render_inet_table
from podnet.dns.ratelimit import ClientLimits

RULE = (
    "ip saddr 10.128.0.0/23 ip daddr 10.128.0.1 udp dport 53 update @dns_clients "
    "{ ip saddr limit rate over 5000/second burst 10000 packets } counter drop"
)


def node(tunnel: str = "vxlan", **overrides: object) -> NodeNetwork:
    values: dict[str, object] = {
        "node_name": "node-1",
        "node_ip": IPv4Address("203.0.113.11"),
        "subnet": IPv4Network("10.128.0.0/23"),
        "cluster_networks": (IPv4Network("10.128.0.0/14"),),
        "service_network": IPv4Network("172.30.0.0/16"),
        "mtu": 1450,
        "tunnel": tunnel,
        "dns_client_qps": 5000.0,
        "dns_client_burst": 10000,
    }
    values.update(overrides)
    return NodeNetwork(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("tunnel", ["vxlan", "host-gw"])
def test_the_dns_meter_is_in_the_input_chain_with_either_tunnel(tunnel: str) -> None:
    view = nftables.table_view(render_inet_table(node(tunnel), "eth0"))
    assert RULE in view.lines
    chain = view.lines.index("chain input {")
    assert view.lines.index(RULE) > chain
    assert f"set {DNS_CLIENTS_SET} {{" in view.lines
    assert "flags dynamic,timeout" in view.lines


def test_no_dns_no_meter() -> None:
    text = render_inet_table(node(dns_client_qps=None), "eth0")
    assert DNS_CLIENTS_SET not in text and "dport 53" not in text


def test_fractional_rates_round_up_and_the_burst_holds_at_least_a_second() -> None:
    text = render_inet_table(node(dns_client_qps=2.5, dns_client_burst=1), "eth0")
    assert "limit rate over 3/second burst 3 packets" in text


def test_the_agent_gives_the_dns_qps_to_the_data_plane_only_when_it_serves_dns() -> None:
    hostsubnet = {"subnet": "10.128.0.0/23", "hostIP": "203.0.113.11"}
    cluster = {"clusterNetworks": [{"CIDR": "10.128.0.0/14"}], "serviceNetwork": "172.30.0.0/16"}
    limits = ClientLimits(qps=800.0, uncached_qps=100.0)
    config = AgentConfig(node_name="node-1", dns_client_limits=limits)
    made = node_network(config, IPv4Address("203.0.113.11"), hostsubnet, cluster)
    assert (made.dns_client_qps, made.dns_client_burst) == (800.0, 1600)
    config = AgentConfig(node_name="node-1", dns=False)
    made = node_network(config, IPv4Address("203.0.113.11"), hostsubnet, cluster)
    assert made.dns_client_qps is None


def test_the_meters_entries_are_the_kernels_and_never_drift() -> None:
    """Listed with entries the kernel added, the table still equals the rendered one: no
    repair (which would replace the table and reset every source's meter)."""
    rendered = render_inet_table(node(), "eth0")
    entries = (
        "\t\telements = { 10.128.0.5 limit rate over 5000/second burst 10000 packets "
        "expires 59s940ms,\n\t\t\t     10.128.0.6 limit rate over 5000/second burst 10000 "
        "packets expires 12s }\n"
    )
    listed = rendered.replace("\t\ttimeout 1m\n", "\t\ttimeout 1m\n" + entries)
    assert listed != rendered
    assert nftables.table_problems("inet podnet", rendered, listed) == []
    assert nftables.repair_script({"inet podnet": rendered}, {"inet podnet": listed}) == ""
    # a fixed set's elements still count
    other = listed.replace("10.128.0.0/14", "10.0.0.0/8")
    assert nftables.table_problems("inet podnet", rendered, other) != []
