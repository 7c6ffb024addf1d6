"""What one service port adds to the service table (pure; ``servicetable`` says what the
table holds): its chains, its map elements and, for a cluster IP, its endpoint group.

A cluster IP's chain (without session affinity) marks traffic from outside the cluster
network for masquerade, picks a number (``numgen random``, kept in the connection's
conntrack mark) and DNATs through the ``endpoints`` map, keyed by destination, protocol,
port and that number. An endpoint that changes, comes or goes is a change of map
elements, not of rules: the kernel validates every chain the table can reach from its
hooks after a rule or a jump is added (~35 ms at 5,000 services), after a plain map
element it validates nothing. A changed number of endpoints is a new chain.
"""

from __future__ import annotations

from collections.abc import Iterable
from socket import inet_ntoa

from podnet.dataplane.interface import NodeNetwork
from podnet.dataplane.linux.servicenft import (
    CLUSTER_NETWORKS,
    ENDPOINT_DIGESTS,
    ENDPOINTS,
    HAIRPIN,
    MASQUERADE_MARK,
    NO_ENDPOINT_IPS,
    NO_ENDPOINT_NODE_PORTS,
    NODE_PORTS,
    REJECT_CHAIN,
    SERVICE_IPS,
    Chain,
    EndpointGroup,
    NftSet,
    PortParts,
    digest,
)
from podnet.services.model import Endpoint, ServicePort

MARK = f"meta mark set meta mark | {MASQUERADE_MARK}"
PICKED = f"dnat ip to ip daddr . meta l4proto . th dport . ct mark map @{ENDPOINTS}"


def port_parts(port: ServicePort, node: NodeNetwork) -> PortParts:
    """The chains, sets, map elements and endpoint group of one service port on ``node``."""
    chains: list[Chain] = []
    sets: list[NftSet] = []
    elements: list[tuple[str, str]] = [
        (HAIRPIN, f"{e.ip} . {e.ip}") for e in port.endpoints if e.local
    ]
    groups: list[tuple[str, EndpointGroup]] = []
    svc: str | None = None
    internal = port.internal_endpoints()
    if port.cluster_ip is not None:
        entry = f"{port.cluster_ip} . {port.protocol} . {port.port}"
        if internal:
            if port.affinity_seconds is None:
                targets = tuple(f"{inet_ntoa(e.ip.packed)} . {e.port}" for e in internal)
                group = EndpointGroup.of(entry, targets)
                groups.append((entry, group))
                elements.append((ENDPOINT_DIGESTS, group.marker(entry)))
                rules: list[str] = [picking(len(targets)), PICKED]
                more_chains: list[Chain] = []
                more_sets: list[NftSet] = []
            else:
                rules, more_chains, more_sets = choose(port, internal, "svc")
            mark_outside = f"ip saddr != @{CLUSTER_NETWORKS} {MARK}"
            chain = addressed("svc", port, (mark_outside, *rules))
            svc = chain.name
            chains += [chain, *more_chains]
            sets += more_sets
            elements.append((SERVICE_IPS, f"{entry} : goto {svc}"))
        else:
            elements.append((NO_ENDPOINT_IPS, f"{entry} : goto {REJECT_CHAIN}"))
    entries = [(SERVICE_IPS, f"{ip} . {port.protocol} . {port.port}") for ip in port.external_ips]
    if port.node_port is not None:
        entries.append((NODE_PORTS, f"{port.protocol} . {port.node_port}"))
    if entries and not port.endpoints:
        refused = {SERVICE_IPS: NO_ENDPOINT_IPS, NODE_PORTS: NO_ENDPOINT_NODE_PORTS}
        elements += [(refused[m], f"{e} : goto {REJECT_CHAIN}") for m, e in entries]
    elif entries:
        rules, more_chains, more_sets = external_rules(port, node, svc)
        ext = addressed("ext", port, tuple(rules))
        chains += [ext, *more_chains]
        sets += more_sets
        elements += [(m, f"{e} : goto {ext.name}") for m, e in entries]
    return PortParts(tuple(chains), tuple(sets), tuple(elements), tuple(groups))


def picking(count: int) -> str:
    """The rule that picks one of ``count`` endpoints at random, into the conntrack mark."""
    return f"ct mark set numgen random mod {count}"


def external_rules(
    port: ServicePort, node: NodeNetwork, svc: str | None
) -> tuple[list[str], list[Chain], list[NftSet]]:
    """A node port's or external IP's rules, by where the packet comes from:

    - this node's own pods: under Local the cluster IP's endpoints (with affinity through
      its chain, which remembers the clients); under Cluster any endpoint,
      unmasqueraded (the reply comes back through this node anyway);
    - with isolation, other nodes' pods: local endpoints only, unmasqueraded, or dropped.
      Masqueraded, a pod's packet would reach an endpoint on a third node from this
      node's address, which isolation and NetworkPolicy always admit;
    - the rest: under Local local endpoints only with the client's address kept (none:
      dropped, the node does not answer); under Cluster any endpoint, masqueraded."""
    external = port.external_endpoints()
    local = [e for e in port.endpoints if e.local]
    rules: list[str] = []
    chains: list[Chain] = []
    sets: list[NftSet] = []

    def add(prefix: str, endpoints: list[Endpoint] | tuple[Endpoint, ...], group: str) -> None:
        found, more_chains, more_sets = choose(port, endpoints, group)
        rules.extend(f"{prefix}{rule}" for rule in found)
        chains.extend(more_chains)
        sets.extend(more_sets)

    own = f"ip saddr {node.subnet} "
    if port.external_local and svc and port.affinity_seconds is not None:
        rules.append(f"{own}goto {svc}")  # the same affinity sets
    elif port.external_local and svc:  # the map is keyed by the cluster IP: not this way
        add(own, port.internal_endpoints(), "own")
    elif not port.external_local:
        add(own, port.endpoints, "own")
    if node.isolation and not port.external_local:
        pods = f"ip saddr @{CLUSTER_NETWORKS} "
        if local:
            add(pods, local, "pods")
        else:
            rules.append(f"{pods}drop")
    if port.external_local:
        if external:
            add("", external, "ext")
        else:
            rules.append("drop")
    else:
        rules.append(MARK)
        add("", external, "ext")
    return rules, chains, sets


def addressed(kind: str, port: ServicePort, rules: tuple[str, ...]) -> Chain:
    """A service port's chain, named by its content: ``<kind>/<key>/<digest of rules>``.
    A change makes a new chain and repoints the map element, so reading the table back
    needs chain names only, never their rules."""
    return Chain(f"{kind}/{port.key}/{digest(rules)}", None, rules)


def choose(
    port: ServicePort, endpoints: Iterable[Endpoint], group: str
) -> tuple[list[str], list[Chain], list[NftSet]]:
    """Rules that DNAT to one of ``endpoints`` at random (affinity first, if any), for
    node ports, external IPs and session affinity (a cluster IP without affinity picks
    through the ``endpoints`` map).

    The pick is a number in the connection's conntrack mark (``numgen random``), then one
    rule per endpoint; an anonymous map per service (``numgen ... map { }``) would make
    every ``nft`` run read thousands of sets (3.6 s instead of 0.6 s to build 5,000
    services; 0.3 s instead of 0.05 s per change)."""
    chosen = sorted(endpoints)
    proto = port.protocol
    pick = [picking(len(chosen))] if len(chosen) > 1 else []
    rules: list[str] = []
    chains: list[Chain] = []
    sets: list[NftSet] = []
    for i, e in enumerate(chosen):
        dnat = f"meta l4proto {proto} dnat to {e.ip}:{e.port}"
        when = f"ct mark 0x{i:08x} " if pick else ""
        if port.affinity_seconds is None:
            pick.append(f"{when}{dnat}")
            continue
        name = f"{group}/{port.key}/{e.ip}-{e.port}/{port.affinity_seconds}"
        chain, aff = f"ep/{name}", f"aff/{name}"
        sets.append(NftSet(aff, "ipv4_addr", "dynamic,timeout", port.affinity_seconds, None))
        chains.append(Chain(chain, None, (f"update @{aff} {{ ip saddr }}", dnat)))
        rules.append(f"ip saddr @{aff} goto {chain}")
        pick.append(f"{when}goto {chain}")
    return [*rules, *pick], chains, sets
