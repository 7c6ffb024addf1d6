"""The egress firewall in the host's nftables (``table inet podnet_egress``), for both data
planes: a pod's packet to a destination outside the cluster is forwarded by the host in
either (routed off ``br0`` on linux, out of ``tun0`` on ovs), after any service DNAT, so
a Service or Endpoints that point outside the cluster pass here too.

::

    table inet podnet_egress {
        set internal { cluster and service networks }
        map pods { local pod IP : jump fw_<vnid> }      one element per firewalled pod
        chain forward { hook forward; ip daddr @internal return; ip saddr vmap @pods }
        chain fw_<vnid> { ip daddr { denied intervals } counter drop }
    }

Each network's intervals are the anonymous set of its chain's one rule, not a named set:
nft reads every named set of a table before it changes an interval set, which made a
change of one network cost what all of them hold (110 ms with 100 networks of 500
intervals, against 25 ms for a rule replaced in one chain).

Per packet: one interval lookup for ``internal``, one hash lookup in ``pods``, one
interval lookup in the network's set, whatever the number of rules or networks. Every
packet is judged (not only a connection's first), so a new Deny cuts established
connections too. The table is replaced in one transaction when it changes and removed
when no local pod is firewalled (``render`` is pure).
"""

from __future__ import annotations

from ipaddress import IPv4Address

from podnet.dataplane.interface import NodeNetwork
from podnet.dataplane.linux import nftables
from podnet.dataplane.linux.nftrules import collapse
from podnet.egress.nodetable import NodeFirewall
from podnet.policy.ranges import Interval

TABLE = "podnet_egress"
TABLE_KEY = f"inet {TABLE}"


def _range(interval: Interval) -> str:
    first, last = interval
    if first == last:
        return str(IPv4Address(first))
    return f"{IPv4Address(first)}-{IPv4Address(last)}"


def render(node: NodeNetwork, firewall: NodeFirewall) -> str | None:
    """The table for ``firewall``; None when no local pod is firewalled (no table)."""
    if not firewall.pods:
        return None
    internal = ", ".join(str(n) for n in collapse((*node.cluster_networks, node.service_network)))
    lines = [
        f"table {TABLE_KEY} {{",
        "\tset internal {",
        "\t\ttype ipv4_addr",
        "\t\tflags interval",
        f"\t\telements = {{ {internal} }}",
        "\t}",
        "\tmap pods {",
        "\t\ttype ipv4_addr : verdict",
        "\t\telements = { "
        + ", ".join(f"{ip} : jump fw_{vnid}" for ip, vnid in sorted(firewall.pods.items()))
        + " }",
        "\t}",
    ]
    chains: list[str] = []
    for vnid, intervals in sorted(firewall.denied.items()):
        chains.append(f"\tchain fw_{vnid} {{")
        if intervals:
            chains.append(f"\t\t{_drop(intervals)}")
        chains.append("\t}")
    lines += [
        *chains,
        "\tchain forward {",
        "\t\ttype filter hook forward priority filter - 1; policy accept;",
        "\t\tip daddr @internal return",
        "\t\tip saddr vmap @pods",
        "\t}",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _drop(intervals: tuple[Interval, ...]) -> str:
    return f"ip daddr {{ {', '.join(_range(i) for i in intervals)} }} counter drop"


def change_script(have: NodeFirewall, want: NodeFirewall) -> str:
    """The nft commands that turn the table rendered for ``have`` into the one for
    ``want`` (both with local pods): only the networks and pods that differ, so a change
    of one network's rules costs what that network holds, not what the node holds."""
    t = TABLE_KEY
    lines: list[str] = []
    added = [v for v in sorted(want.denied) if v not in have.denied]
    removed = [v for v in sorted(have.denied) if v not in want.denied]
    changed = [
        v for v in sorted(want.denied) if v in have.denied and have.denied[v] != want.denied[v]
    ]
    for vnid in added:  # before any pod jumps to them
        lines.append(f"add chain {t} fw_{vnid}")
        if want.denied[vnid]:
            lines.append(f"add rule {t} fw_{vnid} {_drop(want.denied[vnid])}")
    stale = [ip for ip, v in sorted(have.pods.items()) if want.pods.get(ip) != v]
    if stale:
        lines.append(f"delete element {t} pods {{ {', '.join(str(ip) for ip in stale)} }}")
    fresh = [(ip, v) for ip, v in sorted(want.pods.items()) if have.pods.get(ip) != v]
    if fresh:
        pairs = ", ".join(f"{ip} : jump fw_{v}" for ip, v in fresh)
        lines.append(f"add element {t} pods {{ {pairs} }}")
    for vnid in changed:
        lines.append(f"flush chain {t} fw_{vnid}")
        if want.denied[vnid]:
            lines.append(f"add rule {t} fw_{vnid} {_drop(want.denied[vnid])}")
    for vnid in removed:  # no pod jumps to it any more
        lines.append(f"delete chain {t} fw_{vnid}")
    return "".join(line + "\n" for line in lines)


class EgressFirewallNft:
    """Keeps ``table inet podnet_egress`` equal to the last firewall given (call from the
    node's namespace thread: ``nft`` inherits it). The first apply, and the first after a
    failed one, replaces the whole table; later ones change only what differs."""

    def __init__(self) -> None:
        self._have: NodeFirewall | None = None  # what the kernel holds, when known
        self._node: NodeNetwork | None = None  # the networks its ``internal`` set holds
        self._known = False

    def sync(self, node: NodeNetwork, firewall: NodeFirewall) -> bool:
        """Apply ``firewall``; True when the kernel changed."""
        have = self._have if self._known and self._node == node else None
        if have is not None and have.denied == firewall.denied and have.pods == firewall.pods:
            return False
        self._known = False
        if not firewall.pods:
            nftables.delete_tables([TABLE_KEY])
        elif have is None or not have.pods:
            text = render(node, firewall)
            assert text is not None
            nftables.replace_tables([text])
        else:
            nftables.run(change_script(have, firewall))
        self._have, self._node, self._known = firewall, node, True
        return True
