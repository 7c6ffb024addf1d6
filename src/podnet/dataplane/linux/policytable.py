"""Isolation and NetworkPolicy as one nftables table, rendered from the compiled ``RuleSet``.

Pure: ``PolicyRenderer.render`` turns a ``RuleSet`` (``podnet.policy``) into a
``PolicyTable`` value, ``transaction`` turns two such values into the one ``nft -f``
script that goes from the first to the second, and ``parse_listing`` reads a table back
from ``nft -t list table`` (both in ``policyscript``). The linux backend only runs the
script.

``table inet podnet_policy`` (absent when nothing is isolated):

- fail closed (multitenant and networkpolicy, ``RuleSet.fails_closed``): every base
  chain starts with two drops, of a packet whose source or whose destination lies in
  the pod networks (an interval set) and is not owned (an interval set of every running
  pod's and node's address there, as runs of consecutive addresses). They come before
  conntrack's accept, so an orphaned sandbox loses its open connections too; ``input``
  and ``output`` chains hold the same drops, so it reaches neither its node nor anything
  through it (DNS, the outside).

- multitenant: one base chain on the forward hook. It accepts when the source or the
  destination is not a pod of a non-global project (``!= @nonglobal``), and otherwise
  jumps, through a verdict map keyed by the source IP, to the chain of the source's VNID,
  which accepts destinations of that VNID. The rest is dropped. Stateless, so a join or
  an isolate applies to open connections too, and replies pass by the same rule.
- networkpolicy: one base chain, on the forward hook (see ``_Gates``), checks egress
  then ingress. It accepts ``ct state established,related`` first (replies of allowed
  connections, and every later packet of one), jumps to ``egress`` (or ``ingress``) for
  the isolated pods of this node, and drops them when nothing allowed. Traffic between
  a pod and its own node (input and output hooks) is never checked: Kubernetes always
  allows it, and ``evaluate`` says so too; nor is a pod's packet to itself through a
  service (hairpin, marked ``HAIRPIN_MARK`` by ``servicetable``), loopback for
  ``evaluate``. Each compiled rule is one rule (more when it has both pod and ipBlock
  peers, or both port ranges and named ports) matching sets. A node checks egress only
  for its own source pods and ingress only for its own destination pods, so a packet
  between two nodes is checked once per direction and each node holds the rules of its
  own pods. Bridged pod-to-pod frames reach these hooks
  through br_netfilter (``NodeNetwork.isolation``).

Two choices keep a change cheap at thousands of pods and policies:

- Sets are content-addressed: a set's name is a digest of its type and elements, so a set
  is never edited. A change adds new sets, repoints the rules, and deletes the old sets,
  in one transaction. (Editing elements of an existing set makes ``nft`` read every
  element of every set first, about 0.2 s at 30,000 elements; adding a set with its
  elements does not.)
- Rules are spread over ``BUCKETS`` chains per direction by a hash of their text, and a
  change rewrites (flush and refill) only the buckets whose rules changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from ipaddress import IPv4Address
from typing import Any

from podnet.dataplane.linux.policygates import Gates
from podnet.dataplane.linux.policyvalues import (
    FORWARD_FILTER,
    INGRESS_GATE,
    INPUT_FILTER,
    IPV4,
    NAMED_PORTS,
    OUTPUT_FILTER,
    PORTS,
    VERDICT_MAP,
    Chain,
    NftSet,
    PolicyTable,
    bucket,
    set_name,
)
from podnet.policy.model import (
    EGRESS,
    GLOBAL_VNID,
    CompiledPolicy,
    PolicyRule,
    PortRange,
    RuleSet,
)

# --- rendering -----------------------------------------------------------------------------


class PolicyRenderer:
    """Renders ``RuleSet`` values for one node, remembering the sets it rendered last time
    by the identity of their member collections (the compiler hands unchanged policies'
    frozensets back as the same objects), so a small change renders in little time."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self._cache: dict[tuple[int, str], tuple[Any, Any]] = {}
        self._used: dict[tuple[int, str], tuple[Any, Any]] = {}
        self._sets: dict[str, NftSet] = {}
        self._local_pods: frozenset[IPv4Address] = frozenset()
        self._collecting: list[NftSet] | None = None  # sets used by the rule being rendered
        self._texts_kind = ""

    def render(self, rules: RuleSet) -> PolicyTable:
        """The table enforcing ``rules`` on this node (empty when nothing is isolated)."""
        self._used, self._sets = {}, {}
        if rules.isolation is not None:
            chains = self._multitenant(rules)
        elif rules.policies or rules.fails_closed:
            chains = self._network_policy(rules)
        else:
            chains = []
        self._cache = self._used
        if not chains:
            return PolicyTable()
        return PolicyTable(dict(self._sets), {c.name: c for c in chains})

    # --- sets --------------------------------------------------------------------------

    def _memo(self, members: Any, kind: str, make: Callable[[], Any]) -> Any:
        """``make()`` for ``members``, remembered by their identity until a render that
        no longer uses them (the entry holds ``members``, so the id stays theirs)."""
        key = (id(members), kind)
        found = self._used.get(key) or self._cache.get(key)
        if found is None or found[0] is not members:
            found = (members, make())
        self._used[key] = found
        return found[1]

    def _set(self, members: Any, type_: str, interval: bool, show: Any = str) -> str:
        """Name of the set holding ``members`` (rendered with ``show``), made once."""

        def make() -> NftSet:
            elements = tuple(sorted(show(m) for m in members))
            return NftSet(set_name(type_, elements), type_, interval, elements)

        made: NftSet = self._memo(members, type_, make)
        self._sets[made.name] = made
        if self._collecting is not None:
            self._collecting.append(made)
        return made.name

    def _local(self, members: frozenset[IPv4Address], local: frozenset[IPv4Address]) -> Any:
        """``members`` that are pods of this node (remembered like a set)."""
        return self._memo(members, f"local {id(local)}", lambda: members & local)

    # --- fail closed ------------------------------------------------------------------

    def _guard(self, rules: RuleSet) -> tuple[str, ...]:
        """The rules that drop a packet from or to a pod-network address with no live
        owner (``RuleSet.unowned``), first in every base chain (empty when the rule set
        does not fail closed)."""
        if not rules.fails_closed:
            return ()
        networks = self._set(frozenset(rules.pod_networks), IPV4, True)
        owned = self._ranges_set(rules.owned)
        return tuple(
            f"ip {end} @{networks} ip {end} != @{owned} drop" for end in ("saddr", "daddr")
        )

    def _ranges_set(self, members: frozenset[IPv4Address]) -> str:
        """Name of an interval set holding exactly ``members`` as runs of consecutive
        addresses (host-local hands addresses out in order, so a node's pods are a few
        runs): ``nft -f`` reads every element of the table's sets for a transaction that
        adds a set, so thousands of single addresses would slow every policy change."""

        def make() -> NftSet:
            elements = tuple(address_runs(members))
            return NftSet(set_name(IPV4, elements), IPV4, True, elements)

        made: NftSet = self._memo(members, "ranges", make)
        self._sets[made.name] = made
        return made.name

    def _node_chains(self, guard: tuple[str, ...]) -> list[Chain]:
        """The node's own traffic with pods (input and output): the guard alone, so an
        unowned address reaches neither the node nor anything through it."""
        if not guard:
            return []
        return [Chain("input", INPUT_FILTER, guard[:1]), Chain("output", OUTPUT_FILTER, guard[1:])]

    # --- multitenant -------------------------------------------------------------------

    def _multitenant(self, rules: RuleSet) -> list[Chain]:
        assert rules.isolation is not None
        by_vnid: dict[int, list[IPv4Address]] = {}
        for ip, vnid in rules.isolation.vnids:
            if vnid != GLOBAL_VNID:
                by_vnid.setdefault(vnid, []).append(ip)
        nonglobal = frozenset(ip for ips in by_vnid.values() for ip in ips)
        nonglobal |= rules.isolation.unassigned
        guard = self._guard(rules)
        if not nonglobal:
            return (
                [Chain("isolation", FORWARD_FILTER, guard), *self._node_chains(guard)]
                if guard
                else []
            )
        chains = [
            Chain(
                vnid_chain(vnid),
                None,
                (f"ip daddr @{self._set(frozenset(ips), IPV4, False)} accept",),
            )
            for vnid, ips in sorted(by_vnid.items())
        ]
        jumps = frozenset((ip, vnid) for vnid, ips in by_vnid.items() for ip in ips)
        vmap = self._set(jumps, VERDICT_MAP, False, _jump_element)
        members = self._set(nonglobal, IPV4, False)
        base = (
            *guard,
            f"ip saddr != @{members} accept",
            f"ip daddr != @{members} accept",
            f"ip saddr vmap @{vmap}",
            "drop",
        )
        return [Chain("isolation", FORWARD_FILTER, base), *chains, *self._node_chains(guard)]

    # --- networkpolicy -----------------------------------------------------------------

    def _network_policy(self, rules: RuleSet) -> list[Chain]:
        local = frozenset(e.ip for e in rules.endpoints if e.node == self.node_name)
        if local != self._local_pods:
            self._local_pods = local
        local = self._local_pods  # the same object while unchanged: _local remembers by it
        self._texts_kind = f"texts {id(local)}"
        buckets: dict[str, dict[int, set[str]]] = {"egress": {}, "ingress": {}}
        for policy in rules.policies:
            for direction, where, text in self._policy_texts(policy, local):
                buckets[direction].setdefault(where, set()).add(text)
        egress = rules.egress_isolated & local
        ingress = rules.ingress_isolated & local
        guard = self._guard(rules)
        if not (egress or ingress or guard):
            return []
        gates = Gates(
            self._set(egress, IPV4, False) if egress else None,
            self._set(ingress, IPV4, False) if ingress else None,
            guard,
        )
        return [*gates.chains(buckets), *self._node_chains(guard)]

    def _policy_texts(
        self, policy: CompiledPolicy, local: frozenset[IPv4Address]
    ) -> tuple[tuple[str, int, str], ...]:
        """(direction, bucket, rule text) of a policy's rules on this node, remembered by
        the policy's identity (the compiler hands an unchanged policy back as the same
        object), with the sets they use registered again on every render."""

        def make() -> tuple[tuple[tuple[str, int, str], ...], tuple[NftSet, ...]]:
            self._collecting = []
            try:
                found = tuple(
                    ("egress" if rule.direction == EGRESS else "ingress", bucket(text), text)
                    for rule in policy.rules
                    for text in self._rule_texts(rule, local)
                )
                return found, tuple(self._collecting)
            finally:
                self._collecting = None

        found, used = self._memo(policy, self._texts_kind, make)
        for made in used:
            self._sets[made.name] = made
        return found

    def _rule_texts(self, rule: PolicyRule, local: frozenset[IPv4Address]) -> list[str]:
        """The accept rules of one compiled rule on this node (none if no target is here)."""
        targets = self._local(rule.targets, local)
        if not targets:
            return []
        egress = rule.direction == EGRESS
        subject, other = ("ip saddr", "ip daddr") if egress else ("ip daddr", "ip saddr")
        peers = self._peer_matches(rule, other)
        ports = self._port_matches(rule)
        head = f"{subject} @{self._set(targets, IPV4, False)}"
        verdict = f"goto {INGRESS_GATE}" if egress else "accept"
        return [
            " ".join(p for p in (head, peer, port, verdict) if p)
            for peer in peers
            for port in ports
        ]

    def _peer_matches(self, rule: PolicyRule, other: str) -> list[str]:
        peers = rule.peers
        if peers.every_address:
            return [""]
        found = []
        if peers.pods:
            found.append(f"{other} @{self._set(peers.pods, IPV4, False)}")
        if peers.blocks:
            found.append(f"{other} @{self._set(peers.blocks, IPV4, True)}")
        return found

    def _port_matches(self, rule: PolicyRule) -> list[str]:
        ports = rule.ports
        if ports.every_packet:
            return [""]
        found = []
        if ports.ranges:
            found.append(
                f"meta l4proto . th dport @{self._set(ports.ranges, PORTS, True, _range_element)}"
            )
        if ports.named:
            named = self._set(ports.named_keys, NAMED_PORTS, False, _named_element)
            found.append(f"ip daddr . meta l4proto . th dport @{named}")
        return found


def vnid_chain(vnid: int) -> str:
    """The chain accepting destinations of ``vnid``."""
    return f"vnid_{vnid}"


def _jump_element(entry: tuple[IPv4Address, int]) -> str:
    return f"{entry[0]} : jump {vnid_chain(entry[1])}"


def _range_element(span: PortRange) -> str:
    ports = str(span.first) if span.first == span.last else f"{span.first}-{span.last}"
    return f"{span.protocol.lower()} . {ports}"


def _named_element(key: tuple[IPv4Address, str, int]) -> str:
    return f"{key[0]} . {key[1].lower()} . {key[2]}"


def address_runs(members: Iterable[IPv4Address]) -> list[str]:
    """``members`` as nftables interval elements: each run of consecutive addresses as
    ``first-last`` (a lone address as itself), in order."""
    numbers = sorted(int(ip) for ip in members)
    runs: list[tuple[int, int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], number)
        else:
            runs.append((number, number))
    return [
        str(IPv4Address(a)) if a == b else f"{IPv4Address(a)}-{IPv4Address(b)}" for a, b in runs
    ]
