"""The policy table as values: its sets, chains and names, as ``nft`` prints them (see
``policytable`` for what it holds and why). Pure."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

POLICY_TABLE = "podnet_policy"
TABLE_KEY = f"inet {POLICY_TABLE}"
BUCKETS = 32
FORWARD_FILTER = "type filter hook forward priority filter; policy accept;"
INPUT_FILTER = "type filter hook input priority filter; policy accept;"
OUTPUT_FILTER = "type filter hook output priority filter; policy accept;"
ESTABLISHED = "ct state established,related accept"
HAIRPIN_MARK = "0x00008000"  # set by the service proxy on a pod's packet to itself
HAIRPIN = f"meta mark & {HAIRPIN_MARK} == {HAIRPIN_MARK} accept"  # loopback, as evaluate
EGRESS_CHAIN, INGRESS_CHAIN, INGRESS_GATE = "egress", "ingress", "ingress_gate"
IPV4 = "ipv4_addr"
PORTS = "inet_proto . inet_service"
NAMED_PORTS = "ipv4_addr . inet_proto . inet_service"
VERDICT_MAP = "ipv4_addr : verdict"


@dataclass(frozen=True)
class NftSet:
    """A named set (or verdict map) with its elements, rendered as nft prints them."""

    name: str
    type: str
    interval: bool
    elements: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        """``map`` for a verdict map, else ``set``."""
        return "map" if " : " in self.type else "set"

    def body(self) -> str:
        """``{ type ...; flags interval; elements = { ... } }``."""
        parts = [f"type {self.type};"]
        if self.interval:
            parts.append("flags interval;")
        if self.elements:
            parts.append(f"elements = {{ {', '.join(self.elements)} }}")
        return "{ " + " ".join(parts) + " }"


@dataclass(frozen=True)
class Chain:
    """A chain: ``hook`` is the base chain's type/hook/priority line, None for a regular one."""

    name: str
    hook: str | None
    rules: tuple[str, ...]


@dataclass(frozen=True)
class PolicyTable:
    """The whole table. ``sets`` may lack elements when read back (names say enough)."""

    sets: Mapping[str, NftSet] = field(default_factory=dict)
    chains: Mapping[str, Chain] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """True when there is nothing to enforce: no table at all."""
        return not self.chains

    def size(self) -> tuple[int, int]:
        """(rules, set and map elements)."""
        rules = sum(len(c.rules) for c in self.chains.values())
        return rules, sum(len(s.elements) for s in self.sets.values())


def set_name(type_: str, elements: Iterable[str]) -> str:
    """The content address: a digest of the type and the sorted elements."""
    text = type_ + "\n" + "\n".join(elements)
    prefix = "m_" if " : " in type_ else "s_"
    return prefix + hashlib.sha256(text.encode()).hexdigest()[:24]


def bucket(rule: str) -> int:
    """The bucket chain of a rule (stable across runs: a digest, not ``hash``)."""
    return int.from_bytes(hashlib.sha256(rule.encode()).digest()[:4], "big") % BUCKETS
