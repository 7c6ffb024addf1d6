"""The egress firewall in the host's nftables (``table inet podnet_egress``), for both data
planes: a pod's packet to a destination outside the cluster is forwarded by the host in
either (routed off ``br0`` on linux, out of ``tun0`` on ovs), after any service DNAT, so
a Service or Endpoints that point outside the cluster pass here too.

::

    table inet podnet_egress {
        set internal { cluster and service networks }
        map pods { local pod IP : jump fw_<vnid> }      one element per firewalled pod
        set deny_<vnid> { denied intervals }             one per firewalled network
        chain forward { hook forward; ip daddr @internal return; ip saddr vmap @pods }
        chain fw_<vnid> { ip daddr @deny_<vnid> counter drop }
    }

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
        lines += [f"\tset deny_{vnid} {{", "\t\ttype ipv4_addr", "\t\tflags interval"]
        if intervals:
            lines.append(f"\t\telements = {{ {', '.join(_range(i) for i in intervals)} }}")
        lines.append("\t}")
        chains += [f"\tchain fw_{vnid} {{", f"\t\tip daddr @deny_{vnid} counter drop", "\t}"]
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


class EgressFirewallNft:
    """Keeps ``table inet podnet_egress`` equal to the last firewall given (call from the
    node's namespace thread: ``nft`` inherits it)."""

    def __init__(self) -> None:
        self._have: str | None = None
        self._known = False  # whether _have is what the kernel holds

    def sync(self, node: NodeNetwork, firewall: NodeFirewall) -> bool:
        """Apply ``firewall``; True when the kernel changed."""
        want = render(node, firewall)
        if self._known and want == self._have:
            return False
        self._known = False
        if want is None:
            nftables.delete_tables([TABLE_KEY])
        else:
            nftables.replace_tables([want])
        self._have, self._known = want, True
        return True
