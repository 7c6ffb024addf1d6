"""Parsing and validation of the host-local IPAM config, and the round-robin order."""

from __future__ import annotations

import re
from ipaddress import IPv4Address, IPv4Network, IPv6Address, ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from podnet.ipam.config import (
    DEFAULT_DATA_DIR,
    IpamConfigError,
    IpamError,
    Range,
    RangeSet,
    Route,
    load_ipam_config,
    parse_ipam_config,
    parse_range,
    parse_requested_ips,
)

V4 = IPv4Address


def one_range(**fields: str) -> dict[str, Any]:
    return {"type": "host-local", "ranges": [[fields]]}


def test_defaults_follow_the_reference() -> None:
    cfg = parse_ipam_config(one_range(subnet="10.1.2.0/24"))
    (rset,) = cfg.range_sets
    (r,) = rset.ranges
    assert r.subnet == IPv4Network("10.1.2.0/24")
    assert (r.gateway, r.range_start, r.range_end) == (
        V4("10.1.2.1"),
        V4("10.1.2.1"),
        V4("10.1.2.254"),
    )
    assert cfg.data_dir == DEFAULT_DATA_DIR == Path("/var/lib/cni/networks")
    assert cfg.routes == ()
    assert str(rset) == "10.1.2.1-10.1.2.254"


def test_explicit_fields_routes_and_data_dir(tmp_path: Path) -> None:
    cfg = parse_ipam_config(
        {
            "ranges": [
                [
                    {"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.10", "rangeEnd": "10.1.2.20"},
                    {"subnet": "10.1.3.0/24", "gateway": "10.1.3.254"},
                ]
            ],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.128.0.0/14", "gw": "10.1.2.1"}],
            "dataDir": str(tmp_path),
            "resolvConf": "/etc/resolv.conf",
        }
    )
    first, second = cfg.range_sets[0].ranges
    assert (first.range_start, first.range_end, first.gateway) == (
        V4("10.1.2.10"),
        V4("10.1.2.20"),
        V4("10.1.2.1"),
    )
    assert second.gateway == V4("10.1.3.254")
    assert str(cfg.range_sets[0]) == "10.1.2.10-10.1.2.20,10.1.3.1-10.1.3.254"
    assert cfg.routes == (
        Route(IPv4Network("0.0.0.0/0")),
        Route(IPv4Network("10.128.0.0/14"), V4("10.1.2.1")),
    )
    assert cfg.data_dir == tmp_path
    assert cfg.resolv_conf == "/etc/resolv.conf"


def test_legacy_top_level_range_comes_first() -> None:
    cfg = parse_ipam_config(
        {"subnet": "10.9.0.0/16", "rangeStart": "10.9.0.5", "ranges": [[{"subnet": "10.1.2.0/24"}]]}
    )
    assert [str(s) for s in cfg.range_sets] == ["10.9.0.5-10.9.255.254", "10.1.2.1-10.1.2.254"]


def test_runtime_ip_ranges_come_before_everything() -> None:
    req = load_ipam_config(
        {
            "name": "podnet",
            "ipam": {"subnet": "10.9.0.0/16"},
            "runtimeConfig": {"ipRanges": [[{"subnet": "10.7.0.0/24"}]]},
        }
    )
    assert req.network == "podnet"
    assert [str(s) for s in req.config.range_sets] == [
        "10.7.0.1-10.7.0.254",
        "10.9.0.1-10.9.255.254",
    ]


def test_ipv6_parsing() -> None:
    cfg = parse_ipam_config(one_range(subnet="fd00:1::/120"))
    r = cfg.range_sets[0].ranges[0]
    assert cfg.range_sets[0].version == 6
    assert r.gateway == r.range_start == IPv6Address("fd00:1::1")
    assert r.range_end == IPv6Address(
        "fd00:1::ff"
    )  # v6 has no broadcast: last address, like the reference


def test_dual_stack_range_sets() -> None:
    cfg = parse_ipam_config({"ranges": [[{"subnet": "10.1.2.0/24"}], [{"subnet": "fd00::/64"}]]})
    assert [s.version for s in cfg.range_sets] == [4, 6]


BAD_CONFIGS: list[tuple[dict[str, Any], str]] = [
    (
        one_range(subnet="10.1.2.0/24", rangeStart="10.1.3.5"),
        "ranges[0][0].rangeStart 10.1.3.5 is outside subnet 10.1.2.0/24",
    ),
    (
        one_range(subnet="10.1.2.0/24", rangeEnd="10.1.4.1"),
        "ranges[0][0].rangeEnd 10.1.4.1 is outside subnet 10.1.2.0/24",
    ),
    (
        one_range(subnet="10.1.2.0/24", gateway="192.168.0.1"),
        "ranges[0][0].gateway 192.168.0.1 is outside subnet 10.1.2.0/24",
    ),
    (
        one_range(subnet="10.1.2.0/24", gateway="fd00::1"),
        "ranges[0][0].gateway fd00::1 is not IPv4 like subnet 10.1.2.0/24",
    ),
    (
        one_range(subnet="10.1.2.0/24", rangeStart="10.1.2.9", rangeEnd="10.1.2.3"),
        "ranges[0][0].rangeStart 10.1.2.9 is after rangeEnd 10.1.2.3",
    ),
    (
        one_range(subnet="10.1.2.5/24"),
        "ranges[0][0].subnet 10.1.2.5/24 has host bits set (the network address is 10.1.2.0)",
    ),
    (
        one_range(subnet="10.1.2.0/33"),
        "ranges[0][0].subnet '10.1.2.0/33' is not a valid CIDR subnet",
    ),
    (
        one_range(subnet="10.1.2.0/31"),
        "ranges[0][0].subnet 10.1.2.0/31 is too small to allocate from",
    ),
    (
        one_range(subnet="10.1.2.1/32"),
        "ranges[0][0].subnet 10.1.2.1/32 is too small to allocate from",
    ),
    (
        one_range(subnet="10.1.2.0/24", rangeStart="bogus"),
        "ranges[0][0].rangeStart 'bogus' is not a valid IP address",
    ),
    (one_range(rangeStart="10.1.2.3"), "ranges[0][0].subnet is required"),
    ({"ranges": [[{"subnet": 24}]]}, "ranges[0][0].subnet must be a string, got 24"),
    ({"ranges": [[]]}, "ranges[0] is an empty range set"),
    ({"ranges": [{"subnet": "10.1.2.0/24"}]}, "ranges[0] must be a list of ranges"),
    ({"ranges": "10.1.2.0/24"}, "ranges must be a list of range sets"),
    ({"ranges": [["10.1.2.0/24"]]}, "ranges[0][0] must be an object"),
    ({}, "no IP ranges specified"),
    ({"ranges": []}, "no IP ranges specified"),
    (
        {"ranges": [[{"subnet": "10.1.2.0/24"}, {"subnet": "fd00::/64"}]]},
        "ranges[0][1] mixes IPv6 into an IPv4 range set",
    ),
    (
        {"ranges": [[{"subnet": "10.1.2.0/24"}, {"subnet": "10.1.2.0/25"}]]},
        "ranges[0][0] (10.1.2.1-10.1.2.254) overlaps ranges[0][1] (10.1.2.1-10.1.2.126)",
    ),
    (
        {"ranges": [[{"subnet": "10.1.2.0/24"}], [{"subnet": "10.1.0.0/16"}]]},
        "ranges[0] (10.1.2.1-10.1.2.254) overlaps ranges[1] (10.1.0.1-10.1.255.254)",
    ),
    (
        {"subnet": "10.1.2.0/24", "ranges": [[{"subnet": "10.1.2.0/24"}]]},
        "the top-level subnet (10.1.2.1-10.1.2.254) overlaps ranges[0]",
    ),
    (
        {"subnet": "10.1.2.0/24", "rangeStart": "10.1.3.5"},
        "rangeStart 10.1.3.5 is outside subnet 10.1.2.0/24",
    ),
    (
        {**one_range(subnet="10.1.2.0/24"), "routes": [{"gw": "10.1.2.1"}]},
        "routes[0].dst is required",
    ),
    (
        {**one_range(subnet="10.1.2.0/24"), "routes": [{"dst": "x"}]},
        "routes[0].dst 'x' is not a valid CIDR",
    ),
    (
        {**one_range(subnet="10.1.2.0/24"), "routes": [{"dst": "0.0.0.0/0", "gw": "fd00::1"}]},
        "routes[0].gw fd00::1 is not IPv4 like dst 0.0.0.0/0",
    ),
    ({**one_range(subnet="10.1.2.0/24"), "routes": {"dst": "0.0.0.0/0"}}, "routes must be a list"),
    ({**one_range(subnet="10.1.2.0/24"), "dataDir": 7}, "dataDir must be a string, got 7"),
]


@pytest.mark.parametrize(("ipam", "message"), BAD_CONFIGS)
def test_bad_config_names_the_field(ipam: dict[str, Any], message: str) -> None:
    with pytest.raises(IpamConfigError) as err:
        parse_ipam_config(ipam)
    assert str(err.value).startswith(message)
    assert isinstance(err.value, IpamError)
    assert isinstance(err.value, ValueError)


def test_ipam_must_be_an_object() -> None:
    with pytest.raises(IpamConfigError, match="ipam must be an object"):
        parse_ipam_config(["ranges"])  # type: ignore[arg-type]


def test_two_ranges_in_one_subnet_that_do_not_overlap_are_fine() -> None:
    cfg = parse_ipam_config(
        {
            "ranges": [
                [
                    {"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.2", "rangeEnd": "10.1.2.100"},
                    {"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.101", "rangeEnd": "10.1.2.200"},
                ]
            ]
        }
    )
    assert len(cfg.range_sets[0].ranges) == 2


@pytest.mark.parametrize(
    ("netconf", "message"),
    [
        ({"name": "n"}, "IPAM config missing 'ipam' key"),
        ({"name": "a/b", "ipam": one_range(subnet="10.1.2.0/24")}, "network name 'a/b'"),
        ({"name": "..", "ipam": one_range(subnet="10.1.2.0/24")}, "network name '..'"),
        ({"ipam": one_range(subnet="10.1.2.0/24")}, "network name None"),
        (
            {
                "name": "n",
                "ipam": one_range(subnet="10.1.2.0/24"),
                "runtimeConfig": {"ipRanges": {}},
            },
            "runtimeConfig.ipRanges must be a list",
        ),
    ],
)
def test_load_ipam_config_errors(netconf: dict[str, Any], message: str) -> None:
    with pytest.raises(IpamConfigError, match=message.replace("(", r"\(")):
        load_ipam_config(netconf)


def test_requested_ips_from_every_source_in_order_without_duplicates() -> None:
    netconf = {
        "args": {"cni": {"ips": ["10.1.2.7", "10.1.2.5"]}},
        "runtimeConfig": {"ips": ["10.1.2.9/24", "fd00::5"]},
    }
    ips = parse_requested_ips(netconf, "IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.1.2.5,10.1.2.6")
    assert ips == tuple(
        map(ip_address, ["10.1.2.5", "10.1.2.6", "10.1.2.7", "10.1.2.9", "fd00::5"])
    )


def test_requested_ips_empty_and_invalid() -> None:
    assert parse_requested_ips({}, "") == ()
    with pytest.raises(IpamConfigError, match="CNI_ARGS IP 'nope' is not a valid IP address"):
        parse_requested_ips({}, "IP=nope")
    with pytest.raises(IpamConfigError, match="CNI_ARGS: invalid pair 'garbage'"):
        parse_requested_ips({}, "garbage")
    with pytest.raises(
        IpamConfigError, match=re.escape("runtimeConfig.ips must be a string, got 5")
    ):
        parse_requested_ips({"runtimeConfig": {"ips": [5]}}, "")


def test_load_ipam_config_carries_requested_ips() -> None:
    req = load_ipam_config({"name": "n", "ipam": one_range(subnet="10.1.2.0/24")}, "IP=10.1.2.44")
    assert req.requested == (V4("10.1.2.44"),)


# --- round-robin order -------------------------------------------------------------


def rset(*ranges: dict[str, str]) -> RangeSet:
    return RangeSet(tuple(parse_range(r, "r") for r in ranges))


def order(s: RangeSet, last: str | None = None) -> list[str]:
    return [str(ip) for ip, _ in s.candidates(ip_address(last) if last else None)]


def test_candidates_start_at_range_start_and_skip_gateway() -> None:
    assert order(rset({"subnet": "10.0.0.0/29"})) == [f"10.0.0.{i}" for i in range(2, 7)]


def test_candidates_continue_after_last_and_wrap_with_last_last() -> None:
    s = rset({"subnet": "10.0.0.0/29"})
    assert order(s, "10.0.0.4") == ["10.0.0.5", "10.0.0.6", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert order(s, "10.0.0.6") == ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]


def test_candidates_ignore_a_cursor_outside_the_set() -> None:
    s = rset({"subnet": "10.0.0.0/29"})
    assert order(s, "192.168.1.1") == order(s)
    assert order(s, "fd00::1") == order(s)


def test_candidates_skip_gateway_network_and_broadcast_inside_the_range() -> None:
    s = rset(
        {
            "subnet": "10.0.0.0/29",
            "gateway": "10.0.0.4",
            "rangeStart": "10.0.0.0",
            "rangeEnd": "10.0.0.7",
        }
    )
    assert order(s) == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.5", "10.0.0.6"]


def test_candidates_walk_every_range_of_a_set() -> None:
    s = rset({"subnet": "10.0.0.0/29"}, {"subnet": "10.0.1.0/30"})
    assert order(s) == ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.1.2"]
    assert order(s, "10.0.0.6") == [
        "10.0.1.2",
        "10.0.0.2",
        "10.0.0.3",
        "10.0.0.4",
        "10.0.0.5",
        "10.0.0.6",
    ]
    assert order(s, "10.0.1.2")[0] == "10.0.0.2"


@st.composite
def range_and_last(draw: st.DrawFn) -> tuple[Range, IPv4Address | None]:
    prefix = draw(st.integers(min_value=24, max_value=30))
    base = draw(st.integers(min_value=0, max_value=2**24 - 1)) << 8
    net = ip_network((base, prefix))
    assert isinstance(net, IPv4Network)
    size = net.num_addresses
    lo = draw(st.integers(min_value=1, max_value=size - 2))
    hi = draw(st.integers(min_value=lo, max_value=size - 2))
    gw = draw(st.integers(min_value=1, max_value=size - 2))
    r = parse_range(
        {
            "subnet": str(net),
            "rangeStart": str(net[lo]),
            "rangeEnd": str(net[hi]),
            "gateway": str(net[gw]),
        },
        "r",
    )
    last = draw(st.none() | st.integers(min_value=0, max_value=size - 1).map(lambda i: net[i]))
    return r, last


@given(range_and_last())
def test_candidates_visit_each_usable_address_once(case: tuple[Range, IPv4Address | None]) -> None:
    r, last = case
    got = [ip for ip, _ in RangeSet((r,)).candidates(last)]
    usable = [V4(v) for v in range(int(r.range_start), int(r.range_end) + 1) if V4(v) != r.gateway]
    assert sorted(got) == usable  # each once, nothing outside, gateway skipped
    if got and last is not None and r.contains(last):
        after = [ip for ip in usable if ip > last] + [ip for ip in usable if ip <= last]
        assert got == after  # round-robin: start right after the cursor, wrap
