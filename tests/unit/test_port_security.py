"""The underlay switch's port security table (``dataplane.linux.portsecurity``), pure."""

from __future__ import annotations

from podnet.dataplane.linux import portsecurity


def test_each_port_is_bound_to_its_host_s_mac_and_reads_back() -> None:
    ports = {"u-n1": "02:00:00:00:00:01", "u-ext": "02:00:00:00:00:AA"}
    text = portsecurity.render(ports)
    assert "iifname @ports iifname . ether saddr != @hosts drop" in text
    assert portsecurity.ports_in(text) == {
        "u-n1": "02:00:00:00:00:01",
        "u-ext": "02:00:00:00:00:aa",
    }
    empty = portsecurity.render({})
    assert portsecurity.ports_in(empty) == {} and "elements" not in empty
