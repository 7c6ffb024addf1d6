"""Element batches sent without libnftables (``nftbatch``), in a namespace of this test's
own: what they add lists back exactly as nft's own elements do, a failing message voids
the whole batch, and the service table sync sends an endpoint change that way and leaves
the kernel equal to what it rendered."""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import IPv4Address

import pytest

from podnet import netns
from podnet.dataplane.interface import DataPlaneError
from podnet.dataplane.linux.libnft import NftRunner
from podnet.dataplane.linux.nftbatch import ElementBatches, element_batch
from podnet.dataplane.linux.services import ServiceTableSync, read_table
from podnet.dataplane.linux.servicescript import transaction
from podnet.services.model import Endpoint, ServicePort, ServiceTable
from podnet.testing.lab import unique_run
from podnet.testing.nodenetwork import node_network

pytestmark = [pytest.mark.root]

PICKS = "ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service"
DIGESTS = "ipv4_addr . inet_proto . inet_service . mark . mark"
TYPES = {"picks": PICKS, "twin": PICKS, "digests": DIGESTS, "hairpin": "ipv4_addr . ipv4_addr"}
ELEMENTS = {
    "picks": ["172.30.0.8 . udp . 53 . 0x00000007 : 10.131.2.3 . 5353",
              "172.30.0.9 . sctp . 80 . 0xffffffff : 10.1.1.1 . 65535",
              "172.30.0.10 . tcp . 443 . 0x00000000 : 10.128.0.1 . 8443"],
    "digests": ["172.30.0.8 . tcp . 80 . 0x0000000a . 0xdeadbeef"],
    "hairpin": ["10.128.0.5 . 10.128.0.5"],
}  # fmt: skip


@pytest.fixture
def namespace() -> Iterator[str]:
    name = unique_run("nftb")
    netns.create(name)
    try:
        with netns.entered(name):
            yield name
    finally:
        netns.remove(name)


def test_batched_elements_list_back_as_nfts_own(namespace: str) -> None:
    nft = NftRunner()
    kinds = {n: "map" if " : " in t else "set" for n, t in TYPES.items()}
    nft.run(
        "add table ip t\n"
        + "".join(f"add {kinds[n]} ip t {n} {{ type {t}; }}\n" for n, t in TYPES.items())
    )
    nft.run(f"add element ip t twin {{ {', '.join(ELEMENTS['picks'])} }}\n")
    script = "".join(f"add element ip t {n} {{ {', '.join(e)} }}\n" for n, e in ELEMENTS.items())
    batch = element_batch(script, "ip t", TYPES)
    assert batch is not None
    ElementBatches().run("t", batch)
    listed = nft.run("list table ip t")
    picks = nft.run("list map ip t picks").split("elements = ")[1]
    assert picks == nft.run("list map ip t twin").split("elements = ")[1]  # the same text
    for element in ELEMENTS["digests"] + ELEMENTS["hairpin"]:
        assert element in listed
    deleting = "delete element ip t picks { 172.30.0.8 . udp . 53 . 0x00000007 }\n"
    ElementBatches().run("t", element_batch(deleting, "ip t", TYPES) or [])
    assert "172.30.0.8 . udp" not in nft.run("list map ip t picks")


def test_a_failing_message_voids_the_whole_batch(namespace: str) -> None:
    nft = NftRunner()
    nft.run(f"add table ip t\nadd set ip t hairpin {{ type {TYPES['hairpin']}; }}\n")
    script = (
        "add element ip t hairpin { 10.128.0.5 . 10.128.0.5 }\n"
        "delete element ip t hairpin { 10.128.0.9 . 10.128.0.9 }\n"  # not there
    )
    batch = element_batch(script, "ip t", TYPES)
    assert batch is not None
    with pytest.raises(DataPlaneError, match="No such file or directory"):
        ElementBatches().run("t", batch)
    assert "10.128.0.5" not in nft.run("list set ip t hairpin")  # nothing of it happened


def port(i: int, first: int, count: int) -> ServicePort:
    endpoints = tuple(Endpoint(IPv4Address(f"10.131.{first}.{k}"), 8080) for k in range(count))
    return ServicePort(
        "bench", f"s{i:03d}", "", "tcp", 80, IPv4Address(f"172.30.1.{i}"), endpoints=endpoints
    )


def test_an_endpoint_change_is_one_batch_and_the_kernel_matches(namespace: str) -> None:
    node = node_network("node-1", "198.51.100.11", "10.128.0.0/23")
    ips = (IPv4Address("198.51.100.11"),)
    ports = [port(i, i, 3) for i in range(1, 40)]
    sync = ServiceTableSync()
    try:
        sync.sync(node, ServiceTable(tuple(ports), ips))
        assert (sync.transactions, sync.batched) == (1, 0)  # the build: libnftables
        ports[4] = port(5, 200, 3)  # the same count, other addresses: map elements only
        assert sync.sync(node, ServiceTable(tuple(ports), ips))
        assert (sync.transactions, sync.batched) == (2, 1)
        ports[5] = port(6, 201, 2)  # one endpoint fewer: a new chain, through libnftables
        assert sync.sync(node, ServiceTable(tuple(ports), ips))
        assert (sync.transactions, sync.batched) == (3, 1)
        rendered = sync._have
        assert rendered is not None
        kernel = read_table(NftRunner())
        assert kernel is not None and transaction(kernel, rendered) == ""
        assert "10.131.200.2 . 8080" in NftRunner().run("list map ip podnet_services endpoints")
    finally:
        sync.close()
