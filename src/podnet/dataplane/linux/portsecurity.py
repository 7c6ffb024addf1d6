"""Port security for a Linux bridge that plays a switch: each port takes frames only with
the source MAC of the one host plugged into it (what a managed switch's port security
does). The local cluster's underlay uses it, so a host on the underlay cannot forge a
node's MAC (and with it, a node's VXLAN: ``podnet.dataplane.vteppeers``).

``render`` is pure and written as ``nft list table`` prints it; ``apply`` replaces the
table in the calling thread's namespace only when it differs (one transaction); ``allow``
adds (or moves) one port's host, keeping the others.
"""

from __future__ import annotations

from collections.abc import Mapping

from podnet.dataplane.linux import nftables

TABLE = "port_security"
KEY = f"bridge {TABLE}"


def render(ports: Mapping[str, str]) -> str:
    """The bridge-family table for ``ports`` (bridge port name -> its host's MAC): a frame
    that enters one of these ports with another source MAC is dropped; other ports are
    not checked."""
    names = [f'"{port}"' for port in sorted(ports)]
    pairs = [f'"{port}" . {ports[port].lower()}' for port in sorted(ports)]
    body = [
        _set("ports", "ifname", names),
        _set("hosts", "ifname . ether_addr", pairs),
        "\tchain prerouting {",
        "\t\ttype filter hook prerouting priority filter; policy accept;",
        "\t\tiifname @ports iifname . ether saddr != @hosts drop",
        "\t}",
    ]
    return f"table bridge {TABLE} {{\n" + "\n\n".join(body) + "\n}\n"


def _set(name: str, type_: str, elements: list[str]) -> str:
    lines = [f"\tset {name} {{", f"\t\ttype {type_}"]
    if elements:
        lines.append("\t\telements = { " + ",\n\t\t\t     ".join(elements) + " }")
    return "\n".join([*lines, "\t}"])


def apply(ports: Mapping[str, str]) -> bool:
    """Make this namespace's table ``render(ports)``; whether anything changed."""
    listed = nftables.list_table(KEY)
    script = nftables.repair_script({KEY: render(ports)}, {KEY: listed} if listed else {})
    if script:
        nftables.run(script)
    return bool(script)


def ports_in(text: str) -> dict[str, str]:
    """The port -> MAC pairs a listed table holds."""
    pairs = nftables.table_view(text).elements.get("hosts", frozenset())
    found = {}
    for pair in pairs:
        port, _, mac = (part.strip() for part in pair.partition(" . "))
        found[port.strip('"')] = mac.lower()
    return found


def allow(port: str, mac: str) -> bool:
    """Bind bridge port ``port`` to its host's ``mac`` (the other ports as they are);
    whether anything changed."""
    listed = nftables.list_table(KEY)
    ports = ports_in(listed) if listed else {}
    return apply({**ports, port: mac.lower()})
