"""Conjunctive matches: stable conjunction ids, and dimension flows merged by match.

A compiled rule becomes one OpenFlow conjunction: a flow per member of each dimension
(``actions=conjunction(id,k/n)``) and one ``conj_id=id`` flow holding what the rule does.
Two rules with a member in common (the same target pod, peer or port block) must share
that member's flow, since a table holds one flow per (priority, match): its actions then
list every conjunction it belongs to. ``Conjunctions`` collects the members and renders
each distinct match once.

Ids come from a digest of the rule id, so they do not depend on which other rules exist:
adding or removing a policy never renumbers another's conjunctions. Two rule ids whose
digests collide (about one chance in 400 with 5,000 rules) are told apart by probing the
next free id in (digest, rule id) order; only the colliding rules are involved.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from podnet.dataplane.ovs.flow import Flow

ID_SPACE = (1 << 32) - 1  # conj ids 1..2^32-1 (0 left out: it reads as "no conjunction")


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


@dataclass
class Conjunctions:
    """The dimension flows of one table's conjunctions, all at ``priority``."""

    table: int
    priority: int
    _members: dict[str, tuple[int, list[str]]] = field(default_factory=dict)

    def add(
        self, matches: Iterable[str], cookie_of: Callable[[str], int], conj_id: int, k: int, n: int
    ) -> None:
        """``matches`` are dimension ``k`` of ``n`` of conjunction ``conj_id``; a match
        seen first here gets the cookie ``cookie_of(match)`` (every conjunction sharing
        it must name the same: the callers' matches of different kinds never collide)."""
        clause = f"conjunction({conj_id},{k}/{n})"
        members = self._members
        for match in matches:
            found = members.get(match)
            if found is None:
                found = members[match] = (cookie_of(match), [])
            found[1].append(clause)

    def flows(self) -> list[Flow]:
        """One flow per distinct match, its conjunction actions sorted."""
        return [
            Flow(self.table, self.priority, match, ",".join(sorted(set(clauses))), group)
            for match, (group, clauses) in sorted(self._members.items())
        ]
