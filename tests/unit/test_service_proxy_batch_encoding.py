"""Which nft scripts ``nftbatch`` sends itself, and how it lays out their values (the
kernel's side is tests/integration/test_service_proxy_batches.py)."""

from __future__ import annotations

from podnet.dataplane.linux.nftbatch import DELSETELEM, NEWSETELEM, element_batch, encoder

PICKS = "ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service"
TYPES = {"endpoints": PICKS, "node_ips": "ipv4_addr", "service_ips": "ipv4_addr : verdict"}


def test_values_are_laid_out_in_registers_as_nft_does() -> None:
    encode = encoder(PICKS)
    assert encode is not None
    key, data = encode("172.30.0.8 . udp . 53 . 0x00000102 : 10.131.2.3 . 5353")
    assert key == bytes([172, 30, 0, 8, 17, 0, 0, 0, 0, 53, 0, 0]) + (0x102).to_bytes(4, "little")
    assert data == bytes([10, 131, 2, 3, 0x14, 0xE9, 0, 0])  # 5353, network order, padded
    assert encoder("ipv4_addr : verdict") is None and encoder("ether_addr") is None


def test_only_element_changes_of_plain_sets_of_the_table_go_as_a_batch() -> None:
    script = (
        "delete element ip podnet_services endpoints { 172.30.0.8 . tcp . 80 . 0x00000001 }\n"
        "add element ip podnet_services endpoints { 172.30.0.8 . tcp . 80 . 0x00000001 : "
        "10.1.1.1 . 80, 172.30.0.8 . tcp . 80 . 0x00000002 : 10.1.1.2 . 80 }\n"
    )
    batch = element_batch(script, "ip podnet_services", TYPES)
    assert batch is not None
    assert [(verb, name, len(elements)) for verb, name, elements in batch] == [
        (DELSETELEM, "endpoints", 1),
        (NEWSETELEM, "endpoints", 2),
    ]
    refused = [
        "add element ip podnet_services service_ips { 172.30.0.8 . tcp . 80 : goto x }\n",
        "add element ip other endpoints { 172.30.0.8 . tcp . 80 . 0x1 : 10.1.1.1 . 80 }\n",
        "add element ip podnet_services cluster { 10.0.0.0/8 }\n",  # not a known plain set
        "add element ip podnet_services node_ips { 10.0.0.0/8 }\n",  # not an address
        "add chain ip podnet_services svc/x\n",
        "flush chain ip podnet_services svc/x\n",
        "",
        "add element ip podnet_services node_ips { "
        + ", ".join(f"10.0.{i // 256}.{i % 256}" for i in range(600))
        + " }\n",  # too large for one batch: libnftables
    ]
    for text in refused:
        assert element_batch(text, "ip podnet_services", TYPES) is None, text
