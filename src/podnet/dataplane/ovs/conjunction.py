"""Conjunctive matches: stable conjunction ids, and dimension flows merged by match.

A compiled rule becomes one OpenFlow conjunction: a flow per member of each dimension
(``actions=conjunction(id,k/n)``) and one ``conj_id=id`` flow holding what the rule does.
Two rules with a member in common (the same target pod, peer or port block) must share
that member's flow, since a table holds one flow per (priority, match): its actions then
list every conjunction it belongs to. ``Conjunctions`` collects the members and renders
each distinct match once, keeping them between renders.

Ids come from a digest of the rule id, so they do not depend on which other rules exist:
adding or removing a policy never renumbers another's conjunctions. Two rule ids whose
digests collide (about one chance in 400 with 5,000 rules) are told apart by probing the
next free id in (digest, rule id) order; only the colliding rules are involved.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from podnet.dataplane.ovs.flow import Flow

ID_SPACE = (1 << 32) - 1  # conj ids 1..2^32-1 (0 left out: it reads as "no conjunction")


K = TypeVar("K", bound=Hashable)


class HashedKey(Generic[K]):
    """A dict key whose hash is worked out once: rules that may share a conjunction are
    told apart by their peers and ports, whose networks are costly to hash again on
    every render."""

    __slots__ = ("_hash", "value")

    def __init__(self, value: K) -> None:
        self.value, self._hash = value, hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HashedKey):
            return NotImplemented
        return self.value is other.value or self.value == other.value


def _digest(rule_id: str) -> int:
    value = int.from_bytes(hashlib.sha256(rule_id.encode()).digest()[:4], "big")
    return value % ID_SPACE + 1


def conjunction_ids(rule_ids: Iterable[str]) -> dict[str, int]:
    """A distinct conjunction id per rule id, derived from the id itself."""
    found: dict[str, int] = {}
    taken: set[int] = set()
    for wanted, rule_id in sorted((_digest(r), r) for r in set(rule_ids)):
        conj_id = wanted
        while conj_id in taken:
            conj_id = conj_id % ID_SPACE + 1
        taken.add(conj_id)
        found[rule_id] = conj_id
    return found


Member = tuple[str, int, str]  # (match, its flow's cookie, "conjunction(id,k/n)")


@dataclass
class Conjunctions:
    """The dimension flows of one table's conjunctions, all at ``priority``, kept from one
    render to the next: a render names the conjunctions it wants by a key that changes
    whenever their members would, and only the ones added or gone touch member flows
    (a policy change costs its own conjunctions, not every rule's)."""

    table: int
    priority: int
    _held: dict[Hashable, list[Member]] = field(default_factory=dict)
    _members: dict[str, tuple[int, dict[str, int]]] = field(default_factory=dict)
    _flows: dict[str, Flow] = field(default_factory=dict)

    def render(self, wanted: Mapping[Hashable, Callable[[], list[Member]]]) -> list[Flow]:
        """One flow per distinct member match of the ``wanted`` conjunctions (key ->
        a function listing its members), its conjunction actions sorted."""
        dirty: set[str] = set()
        for key in [k for k in self._held if k not in wanted]:
            for match, _, clause in self._held.pop(key):
                counts = self._members[match][1]
                counts[clause] -= 1
                if not counts[clause]:
                    del counts[clause]
                dirty.add(match)
        for key, members in wanted.items():
            if key in self._held:
                continue
            entries = self._held[key] = members()
            for match, group, clause in entries:
                counts = self._members.setdefault(match, (group, {}))[1]
                counts[clause] = counts.get(clause, 0) + 1
                dirty.add(match)
        for match in dirty:
            group, counts = self._members[match]
            if counts:
                actions = ",".join(sorted(counts))
                self._flows[match] = Flow(self.table, self.priority, match, actions, group)
            else:
                del self._members[match]
                del self._flows[match]
        return [self._flows[match] for match in sorted(self._flows)]


def members(
    matches: Iterable[str], cookie_of: Callable[[str], int], conj_id: int, k: int, n: int
) -> list[Member]:
    """``matches`` as dimension ``k`` of ``n`` of conjunction ``conj_id``."""
    clause = f"conjunction({conj_id},{k}/{n})"
    return [(match, cookie_of(match), clause) for match in matches]
