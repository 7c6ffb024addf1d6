"""The hand-encoded netlink requests of the pod hot path, read back by pyroute2's parsers
(so they say what pyroute2 would send), and the reading of the kernel's answers."""

from __future__ import annotations

import errno
import struct
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import Any

import pytest
from pyroute2.netlink.nfnetlink.nftsocket import nft_set_elem_list_msg
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg
from pyroute2.nftables.main import NFTSetElem

from podnet.dataplane.linux import nftables, portset, rtnl
from podnet.dataplane.linux.desired import PodPort

HEADER = struct.Struct("=IHHII")


def message(request: rtnl.Request, seq: int = 1) -> bytes:
    return HEADER.pack(HEADER.size + len(request.body), request.type, request.flags, seq, 0) + (
        request.body
    )


def parsed(cls: Any, request: rtnl.Request) -> Any:
    msg = cls(message(request))
    msg.decode()
    return msg


def test_veth_request_is_one_message_with_the_peer_in_the_pod_namespace() -> None:
    peer = rtnl.PeerEnd("eth0", 7, "0a:58:0a:80:00:02")
    request = rtnl.create_veth("pn0123456789ab", 5, 1450, peer)
    msg = parsed(ifinfmsg, request)
    assert request.type == rtnl.RTM_NEWLINK and request.flags == rtnl.NEW
    assert msg["flags"] & rtnl.IFF_UP and msg["change"] & rtnl.IFF_UP  # the host end comes up
    assert msg.get_attr("IFLA_IFNAME") == "pn0123456789ab"
    assert msg.get_attr("IFLA_MTU") == 1450 and msg.get_attr("IFLA_MASTER") == 5
    info = msg.get_attr("IFLA_LINKINFO")
    assert info.get_attr("IFLA_INFO_KIND") == "veth"
    inner = info.get_attr("IFLA_INFO_DATA").get_attr("VETH_INFO_PEER")
    assert dict(inner["attrs"]) == {
        "IFLA_IFNAME": "eth0",
        "IFLA_NET_NS_FD": 7,
        "IFLA_ADDRESS": "0a:58:0a:80:00:02",
        "IFLA_MTU": 1450,
    }
    assert inner["flags"] == 0  # the kernel refuses a peer that comes up at creation


def test_link_requests_name_the_link() -> None:
    alias = parsed(ifinfmsg, rtnl.set_link("pn1", alias="podnet/1 c eth0"))
    assert dict(alias["attrs"]) == {"IFLA_IFNAME": "pn1", "IFLA_IFALIAS": "podnet/1 c eth0"}
    assert alias["change"] == 0  # an alias alone does not touch the flags
    up = parsed(ifinfmsg, rtnl.set_link("lo", up=True))
    assert up["flags"] == up["change"] == rtnl.IFF_UP
    for request in (rtnl.get_link("eth0"), rtnl.delete_link("eth0")):
        assert dict(parsed(ifinfmsg, request)["attrs"]) == {"IFLA_IFNAME": "eth0"}
        assert errno.ENODEV in request.tolerate


def test_address_and_routes() -> None:
    addr = parsed(ifaddrmsg, rtnl.add_address(3, IPv4Interface("10.128.0.2/23")))
    assert (addr["family"], addr["prefixlen"], addr["index"]) == (2, 23, 3)
    assert dict(addr["attrs"]) == {"IFA_LOCAL": "10.128.0.2", "IFA_ADDRESS": "10.128.0.2"}
    gateway = IPv4Address("10.128.0.1")
    default = parsed(rtmsg, rtnl.add_route(IPv4Network("0.0.0.0/0"), gateway, 3))
    assert (default["dst_len"], default["table"], default["proto"]) == (0, 254, 4)
    assert dict(default["attrs"]) == {"RTA_GATEWAY": "10.128.0.1", "RTA_OIF": 3, "RTA_TABLE": 254}
    cluster = parsed(rtmsg, rtnl.add_route(IPv4Network("10.128.0.0/14"), gateway, 3))
    assert cluster["dst_len"] == 14 and cluster.get_attr("RTA_DST") == "10.128.0.0"
    assert errno.EEXIST in rtnl.add_route(IPv4Network("0.0.0.0/0"), gateway, 3).tolerate


def test_element_change_is_what_pyroute2_sends() -> None:
    port = PodPort("pn0123456789ab", "0a:58:0a:80:00:02", IPv4Address("10.128.0.2"))
    request = portset.element_change("add", [port])
    ours = message(request)
    theirs = nft_set_elem_list_msg()
    theirs["nfgen_family"] = portset.NFPROTO_BRIDGE
    theirs["attrs"] = [
        ["NFTA_SET_ELEM_LIST_TABLE", "podnet"],
        ["NFTA_SET_ELEM_LIST_SET", "pod_ports"],
        [
            "NFTA_SET_ELEM_LIST_ELEMENTS",
            [NFTSetElem(value=nftables.element_key(port)).as_netlink(None)],
        ],
    ]
    theirs["header"]["type"] = request.type
    theirs["header"]["flags"] = request.flags
    theirs["header"]["sequence_number"] = 1
    theirs.encode()
    assert ours == theirs.data
    delete = portset.element_change("del", [port])
    assert delete.type & 0xFF == portset.NFT_MSG_DELSETELEM
    assert not delete.flags & rtnl.NLM_F_CREATE


def test_a_transaction_wraps_the_change_in_batch_markers() -> None:
    change = portset.element_change("add", [])
    begin, middle, end = portset.transaction(change)
    assert (begin.type, middle, end.type) == (portset.NFNL_MSG_BATCH_BEGIN, change, 0x11)
    assert begin.body == struct.pack("!BBH", 0, 0, portset.NFNL_SUBSYS_NFTABLES)
    assert not begin.acked and not end.acked and change.acked


def ack(seq: int, code: int = 0) -> bytes:
    body = struct.pack("=i", -code) + HEADER.pack(16, 0, 0, seq, 0)
    return HEADER.pack(HEADER.size + len(body), rtnl.NLMSG_ERROR, 0, seq, 0) + body


def test_answers_are_matched_to_requests_by_sequence() -> None:
    link = HEADER.pack(32, rtnl.RTM_NEWLINK, 0, 2, 0) + struct.pack("=BxHiII", 0, 1, 9, 0, 0)
    data = ack(1) + link + ack(2)
    assert [(seq, kind) for seq, kind, _ in rtnl._messages(data)] == [
        (1, rtnl.NLMSG_ERROR),
        (2, rtnl.RTM_NEWLINK),
        (2, rtnl.NLMSG_ERROR),
    ]
    pending = {
        1: rtnl._Pending(rtnl.set_link("lo", up=True)),
        2: rtnl._Pending(rtnl.get_link("eth0")),
    }
    for seq, kind, body in rtnl._messages(data):
        rtnl._record(pending, seq, kind, body)
    assert all(p.answered for p in pending.values())
    assert pending[1].reply is None and rtnl.link_index(pending[2].reply or b"") == 9


def test_a_refusal_is_recorded_with_its_errno() -> None:
    pending = {4: rtnl._Pending(rtnl.delete_link("pnx"))}
    for seq, kind, body in rtnl._messages(ack(4, errno.EBUSY)):
        rtnl._record(pending, seq, kind, body)
    assert pending[4].answered and pending[4].error == errno.EBUSY
    failure = rtnl.RequestFailed("deleting link pnx", errno.EBUSY)
    assert failure.code == errno.EBUSY and "Device or resource busy" in str(failure)


@pytest.mark.parametrize("name", ["lo", "eth0"])
def test_strings_are_nul_terminated_and_padded(name: str) -> None:
    encoded = rtnl.attr_str(rtnl.IFLA_IFNAME, name)
    assert len(encoded) % 4 == 0
    length, kind = struct.unpack_from("=HH", encoded)
    assert kind == rtnl.IFLA_IFNAME and encoded[4:length] == name.encode() + b"\0"
