"""NetworkPolicy as tables 21 (egress) and 80 (ingress): conntrack, conjunctive matches.

``NetworkPolicyFlows`` renders, for one node (``LocalView``), table 21 judging the egress
of its pods and table 80 their ingress, from conntrack state (``ct_state``; CLASSIFY has
tracked every IP packet already, the ``-trk`` flow is a safety net):

- replies (``+rpl``) and related packets pass; a packet of an established connection
  passes when this table has allowed it before (``ct_mark`` bit ``MARK_EGRESS`` or
  ``MARK_INGRESS``, set by the commit of an allowed packet), otherwise it is judged like
  a new one. That keeps out a connection that passed 21 but not 80 on the same node: its
  next packets are established but lack ``MARK_INGRESS``. In 80 a reply from a local pod
  also needs ``MARK_INGRESS`` (that pod's ingress allowed the connection).
- the node's own addresses and a pod itself (a service hairpin) always pass; so does a
  pod's packet to the service network (``LocalView.service_network``) in 21: its real
  destination is known only after the host's DNAT, and the pipeline sends a local pod's
  packet that comes back from tun0 through 21 again.
- a pod isolated for the direction needs a rule. Rules become conjunctions of up to three
  dimensions: the local targets (``nw_src`` in 21, ``nw_dst`` in 80), the peers (pod IPs
  and ipBlock networks on the other field) and the ports (each range as aligned
  ``tp_dst`` blocks, named ports as ``nw_dst,tp_dst`` entries). Rules with equal peers
  and ports share one conjunction over the union of their targets (policies that differ
  only in whom they select, the common case, cost one). Its id comes from a digest of
  the first of its rule ids, not from other rules: a policy whose ports or peers change
  keeps its id (unless it shared one), so only the flows of what changed are rewritten,
  not those of all its peers. A single dimension (every address, every packet) is a
  plain flow per target. ``conjunction_of`` maps rule ids to conj ids.
- an isolated pod without a matching rule is dropped; any other packet is allowed.
  Allowed packets are committed to conntrack with the table's mark bit.

Flows grow as pods + policies: one flow per local pod per direction, per distinct peer
and port block, and per conjunction (``conj_id``); never pods x pods. A member flow lists
every conjunction it belongs to, so conjunction actions grow with the distinct (peers,
ports) pairs times their peers. Groups (cookies): the mode's fixed flows, one per local
pod (its target and isolation flows), one per shared match (a peer, a port block) and
one per conjunction (its ``conj_id`` flow). Changing a policy changes the groups of the
pods, peers, ports and conjunctions its rules name, nothing else.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network

from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.conjunction import (
    Conjunctions,
    HashedKey,
    Member,
    conjunction_ids,
    members,
)
from podnet.dataplane.ovs.flow import Flow, Kind, cookie
from podnet.dataplane.ovs.portmasks import port_matches
from podnet.model.network import NETWORKPOLICY
from podnet.policy.model import (
    EGRESS,
    INGRESS,
    NamedPort,
    PeerSet,
    PolicyRule,
    PortRange,
    RuleSet,
)

MARK_EGRESS = 0x2  # ct_mark bit: table 21 allowed this connection (0x1 is the pipeline's)
MARK_INGRESS = 0x4  # ct_mark bit: table 80 allowed this connection
DELIVER = f"output:NXM_NX_{t.REG_OUT_PORT.upper()}[]"
TO_ROUTE = f"goto_table:{t.ROUTE}"

# priorities, highest first
P_UNTRACKED = 400
P_REPLY_INGRESS = 310  # 80: a reply the local pod's ingress allowed
P_REPLY_UNCHECKED = 305  # 80: a reply from a local pod whose ingress never allowed it
P_REPLY = 302
P_ESTABLISHED = 301
P_RELATED = 299
P_ALWAYS = 250  # the node's own addresses, a pod to itself
P_PLAIN_RULE = 201
P_CONJUNCTION = 200
P_ISOLATED = 100
P_OPEN = 50
P_DEFAULT = 0


@dataclass(frozen=True)
class LocalView:
    """What one node knows of itself: its name, its pods (IP → ofport), its addresses,
    and the service network (networkpolicy: a pod's packet to a service passes 21
    unjudged; the pipeline brings it back through 21 after the host's DNAT)."""

    node: str
    pods: Mapping[IPv4Address, int]
    addresses: frozenset[IPv4Address] = frozenset()
    service_network: IPv4Network | None = None


def mode_cookie(plugin: str) -> int:
    """The group of a mode's fixed flows."""
    return cookie(Kind.ISOLATION, f"mode/{plugin}")


@functools.lru_cache(maxsize=1 << 16)
def pod_cookie(ip: IPv4Address) -> int:
    """Networkpolicy: one local pod's isolation and target flows."""
    return cookie(Kind.POLICY_POD, f"pod/{ip}")


def conjunction_cookie(table: int, conj_id: int) -> int:
    """Networkpolicy: one conjunction's ``conj_id`` flow."""
    return cookie(Kind.POLICY, f"conjunction/{table}/{conj_id}")


@functools.lru_cache(maxsize=1 << 16)
def match_cookie(table: int, match: str) -> int:
    """Networkpolicy: one shared peer or port match of ``table``."""
    return cookie(Kind.POLICY_MATCH, f"match/{table}/{match}")


@dataclass(frozen=True)
class _Direction:
    """One direction's table and how it speaks of the local pod and the other end."""

    table: int
    subject: str  # the field holding the local pod judged here
    peer: str  # the field holding the other end
    passes: str  # actions of a packet this table lets through
    mark: int  # its ct_mark bit

    @property
    def allows(self) -> str:
        """Actions of an allowed packet: commit with this table's mark, then pass."""
        # the one-bit load, as the switch shows it (a masked set_field reads back as this
        # and ovs-ofctl would take it for another flow on every comparison)
        commit = f"ct(commit,exec(load:0x1->NXM_NX_CT_MARK[{self.mark.bit_length() - 1}]))"
        return f"{commit},{self.passes}"


EGRESS_SIDE = _Direction(t.EGRESS_POLICY, "nw_src", "nw_dst", TO_ROUTE, MARK_EGRESS)
INGRESS_SIDE = _Direction(t.ISOLATION, "nw_dst", "nw_src", DELIVER, MARK_INGRESS)


_Grouping = tuple[PeerSet, bool, tuple[PortRange, ...], frozenset[NamedPort] | None]


@dataclass
class _Conjunction:
    """Rules of one direction with equal peers and ports: one conjunction whose targets
    are the union of theirs ((T1 x P x Q) | (T2 x P x Q) is (T1 | T2) x P x Q). Ingress
    named ports are pinned to their pod (``nw_dst``), which is one of the rule's own
    targets, so ingress rules that differ only in them merge too, their entries united."""

    peers: PeerSet
    every_packet: bool
    ranges: tuple[PortRange, ...]
    egress_named: frozenset[NamedPort] | None  # egress: part of what it is; ingress: None
    targets: set[IPv4Address] = field(default_factory=set)
    named: set[tuple[IPv4Address, str, int]] = field(default_factory=set)
    rule_ids: list[str] = field(default_factory=list)

    @staticmethod
    def grouping(rule: PolicyRule) -> _Grouping:
        """What rules sharing a conjunction have in common."""
        ports = rule.ports
        named = ports.named if rule.direction == EGRESS else None
        return (rule.peers, ports.every_packet, ports.ranges, named)


@dataclass
class _Texts:
    """Peer matches of the sets one render meets, each set done once (rules share their
    peer sets: the compiler hands out one frozenset per distinct selection)."""

    _done: dict[tuple[int, str], tuple[frozenset[IPv4Address], list[str]]] = field(
        default_factory=dict
    )

    def peers(self, fieldname: str, members: frozenset[IPv4Address]) -> list[str]:
        """``ip,<fieldname>=<address>`` for each member, sorted by address."""
        found = self._done.get((id(members), fieldname))
        if found is None or found[0] is not members:
            texts = [f"ip,{fieldname}={_text(ip)}" for ip in sorted(members, key=int)]
            found = self._done[(id(members), fieldname)] = (members, texts)
        return found[1]


@functools.lru_cache(maxsize=1 << 16)
def _text(ip: IPv4Address) -> str:
    """``str(ip)``, remembered (ipaddress builds the text anew each time)."""
    return str(ip)


def _named_order(entry: tuple[IPv4Address, str, int]) -> tuple[int, str, int]:
    return int(entry[0]), entry[1], entry[2]


@functools.lru_cache(maxsize=1 << 16)
def _pod_cookie_of(match: str) -> int:
    """The cookie of a target's match ``ip,nw_src=<pod>``: that pod's group."""
    return pod_cookie(IPv4Address(match.rsplit("=", 1)[1]))


@dataclass
class Kept:
    """A node's render kept for the next: per table, its conjunctions' member flows and,
    per rule by identity (valid while ``isolated`` stays), its ``_LocalRule``."""

    conjunctions: dict[int, Conjunctions] = field(default_factory=dict)
    isolated: dict[int, frozenset[IPv4Address]] = field(default_factory=dict)
    rules: dict[int, dict[int, _LocalRule]] = field(default_factory=dict)


_Named = tuple[tuple[IPv4Address, str, int], ...]
_LocalRule = tuple[PolicyRule, frozenset[IPv4Address], _Named, HashedKey[_Grouping]]


@dataclass
class NetworkPolicyFlows:
    """One render of tables 21 and 80. ``kept``: the member flows of the last render for
    this node, updated in place (only conjunctions added or gone since cost anything);
    a fresh dict renders from scratch, with the same result."""

    view: LocalView
    rules: RuleSet
    kept: Kept = field(default_factory=Kept)
    _flows: list[Flow] = field(default_factory=list)
    conjunction_of: dict[str, tuple[int, int]] = field(default_factory=dict)  # rule id ->
    _texts: _Texts = field(default_factory=_Texts)

    def flows(self) -> list[Flow]:
        local = frozenset(self.view.pods)
        for side in (EGRESS_SIDE, INGRESS_SIDE):
            self._fixed(side, local)
            egress = side is EGRESS_SIDE
            isolated = (
                self.rules.egress_isolated if egress else self.rules.ingress_isolated
            ) & local
            for ip in sorted(isolated, key=int):
                match = f"ip,{side.subject}={_text(ip)}"
                self._flows.append(Flow(side.table, P_ISOLATED, match, "drop", pod_cookie(ip)))
            found: dict[HashedKey[_Grouping], _Conjunction] = {}
            for rule, targets, entries, grouping in self._local_rules(side, isolated):
                conj = found.get(grouping)
                if conj is None:
                    conj = found[grouping] = _Conjunction(*grouping.value)
                conj.targets |= targets
                conj.named.update(entries)  # ingress: pinned to a target, this node's only
                conj.rule_ids.append(rule.id)
            named = {min(conj.rule_ids): conj for conj in found.values()}
            ids = conjunction_ids(named)
            wanted: dict[Hashable, Callable[[], list[Member]]] = {}
            plain: set[Flow] = set()
            for first, conj in sorted(named.items()):
                if self._conjunction(side, conj, ids[first], wanted, plain):
                    self.conjunction_of.update((r, (side.table, ids[first])) for r in conj.rule_ids)
            kept = self.kept.conjunctions.setdefault(
                side.table, Conjunctions(side.table, P_CONJUNCTION)
            )
            self._flows += kept.render(wanted)
            self._flows += plain
        return self._flows

    def _local_rules(self, side: _Direction, isolated: frozenset[IPv4Address]) -> list[_LocalRule]:
        """The rules of ``side``'s direction with a target among ``isolated``: each with
        those targets and (ingress) its named entries on them; taken from the last render
        for a rule that is the same object, when ``isolated`` is the same too."""
        table, egress = side.table, side is EGRESS_SIDE
        direction = EGRESS if egress else INGRESS
        last = self.kept.rules.get(table) if self.kept.isolated.get(table) == isolated else None
        known: dict[int, _LocalRule] = {}
        found = []
        for rule in self.rules.rules:
            if rule.direction != direction:
                continue
            entry = None if last is None else last.get(id(rule))
            if entry is None or entry[0] is not rule:
                targets = rule.targets & isolated
                named: _Named = ()
                if targets and not egress:
                    named = tuple(
                        (n.ip, n.protocol, n.port) for n in rule.ports.named if n.ip in targets
                    )
                entry = (rule, targets, named, HashedKey(_Conjunction.grouping(rule)))
            known[id(rule)] = entry
            if entry[1]:
                found.append(entry)
        self.kept.rules[table], self.kept.isolated[table] = known, isolated
        return found

    def _fixed(self, side: _Direction, local: frozenset[IPv4Address]) -> None:
        """The mode's fixed flows of one table, the node's addresses and pod hairpins."""
        fixed, table = mode_cookie(NETWORKPOLICY), side.table
        specs = [
            (P_UNTRACKED, "ip,ct_state=-trk", f"ct(table={table})"),
            (P_ESTABLISHED, f"ip,ct_state=+est+trk,ct_mark={side.mark:#x}/{side.mark:#x}",
             side.passes),
            (P_RELATED, "ip,ct_state=+rel+trk", side.passes),
            (P_OPEN, "ip", side.allows),
            (P_DEFAULT, "", side.passes),
        ]  # fmt: skip
        if side is INGRESS_SIDE:
            mark = f"{MARK_INGRESS:#x}/{MARK_INGRESS:#x}"
            specs.append((P_REPLY_INGRESS, f"ip,ct_state=+rpl+trk,ct_mark={mark}", DELIVER))
        specs.append((P_REPLY, "ip,ct_state=+rpl+trk", side.passes))
        for address in sorted(self.view.addresses):
            specs.append((P_ALWAYS, f"ip,{side.peer}={address}", side.passes))
        if side is EGRESS_SIDE and self.view.service_network is not None:
            # the destination is known after the host's DNAT: judged when it comes back
            specs.append((P_ALWAYS, f"ip,nw_dst={self.view.service_network}", TO_ROUTE))
        self._flows += [Flow(table, prio, match, actions, fixed) for prio, match, actions in specs]
        for ip in sorted(local, key=int):
            group = pod_cookie(ip)
            self._flows.append(Flow(table, P_ALWAYS, f"ip,nw_src={ip},nw_dst={ip}", side.passes,
                                    group))  # fmt: skip
            if side is INGRESS_SIDE:
                match = f"ip,ct_state=+rpl+trk,nw_src={ip}"
                self._flows.append(Flow(table, P_REPLY_UNCHECKED, match, "drop", group))

    def _conjunction(
        self,
        side: _Direction,
        conj: _Conjunction,
        conj_id: int,
        wanted: dict[Hashable, Callable[[], list[Member]]],
        plain: set[Flow],
    ) -> bool:
        """One conjunction, wanted by a key that says all its members depend on (plain
        flows for one of a single dimension); False when it allows nothing (no peer or no
        port left)."""
        table, peers = side.table, conj.peers
        named = frozenset(conj.named)
        if conj.egress_named is not None:  # egress: the grouping's own, whole
            named = frozenset((n.ip, n.protocol, n.port) for n in conj.egress_named)
        if not peers.every_address and not (peers.pods or peers.blocks):
            return False
        if not conj.every_packet and not (conj.ranges or named):
            return False
        dimensions = 1 + (not peers.every_address) + (not conj.every_packet)
        if dimensions == 1:
            plain.update(
                Flow(table, P_PLAIN_RULE, m, side.allows, _pod_cookie_of(m))
                for m in self._targets(side, conj)
            )
            return False
        key = (
            table,
            conj_id,
            frozenset(conj.targets),
            peers,
            conj.every_packet,
            conj.ranges,
            named,
        )
        wanted[key] = functools.partial(self._members, side, conj, named, conj_id, dimensions)
        self._flows.append(
            Flow(table, P_CONJUNCTION, f"conj_id={conj_id},ip", side.allows,
                 conjunction_cookie(table, conj_id))
        )  # fmt: skip
        return True

    def _members(
        self,
        side: _Direction,
        conj: _Conjunction,
        named: frozenset[tuple[IPv4Address, str, int]],
        conj_id: int,
        dimensions: int,
    ) -> list[Member]:
        """The members of one conjunction's dimensions: targets, peers, ports."""
        shared = functools.partial(match_cookie, side.table)
        found = members(self._targets(side, conj), _pod_cookie_of, conj_id, 1, dimensions)
        k = 1
        if not conj.peers.every_address:
            peers = self._texts.peers(side.peer, conj.peers.pods)
            peers = peers + [_address_match(side.peer, net) for net in conj.peers.blocks]
            k += 1
            found += members(peers, shared, conj_id, k, dimensions)
        if not conj.every_packet:
            ports = [m for span in conj.ranges for m in port_matches(span)]
            ports += [
                f"{proto.lower()},nw_dst={_text(ip)},tp_dst={port}"
                for ip, proto, port in sorted(named, key=_named_order)
            ]
            found += members(ports, shared, conj_id, k + 1, dimensions)
        return found

    @staticmethod
    def _targets(side: _Direction, conj: _Conjunction) -> list[str]:
        return [f"ip,{side.subject}={_text(ip)}" for ip in sorted(conj.targets, key=int)]


def _address_match(fieldname: str, address: IPv4Address | IPv4Network) -> str:
    if isinstance(address, IPv4Network):
        if address.prefixlen == 0:
            return "ip"
        if address.prefixlen < 32:
            return f"ip,{fieldname}={address}"
        address = address.network_address
    return f"ip,{fieldname}={address}"
