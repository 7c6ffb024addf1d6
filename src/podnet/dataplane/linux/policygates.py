"""The NetworkPolicy base chain and its gates around the rule buckets (see
``policytable``): pure values, one ``Chain`` each."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from podnet.dataplane.linux.policyvalues import (
    EGRESS_CHAIN,
    ESTABLISHED,
    FORWARD_FILTER,
    HAIRPIN,
    INGRESS_CHAIN,
    INGRESS_GATE,
    Chain,
)


@dataclass(frozen=True)
class Gates:
    """The NetworkPolicy chains around the rule buckets, given the names of the sets of
    this node's egress- and ingress-isolated pods (None: no such pod).

    One base chain, ``forward``, checking egress then ingress, so a packet of an open
    connection costs one conntrack test, and nothing else is hooked (the tunnel's own
    packets on input and output meet no podnet rule). An egress rule that allows goes on
    to ``ingress_gate`` (``goto``: it ends there, accepted or dropped), so that passing
    egress never skips the ingress check; ingress rules accept.
    """

    egress: str | None
    ingress: str | None
    guard: tuple[str, ...] = ()  # fail closed: first, before even established connections

    def chains(self, buckets: Mapping[str, Mapping[int, set[str]]]) -> list[Chain]:
        egress_check = self._check("ip saddr", self.egress, EGRESS_CHAIN)
        ingress_check = self._check("ip daddr", self.ingress, INGRESS_CHAIN)
        base = (*self.guard, ESTABLISHED, HAIRPIN, *egress_check, *ingress_check)
        found = [
            Chain("forward", FORWARD_FILTER, base),
            Chain(INGRESS_GATE, None, (*ingress_check, "accept")),
        ]
        for direction, present in ((EGRESS_CHAIN, self.egress), (INGRESS_CHAIN, self.ingress)):
            if present:
                found += bucket_chains(direction, buckets[direction])
        return found

    @staticmethod
    def _check(subject: str, isolated: str | None, chain: str) -> tuple[str, ...]:
        if isolated is None:
            return ()
        return (f"{subject} @{isolated} jump {chain}", f"{subject} @{isolated} drop")


def bucket_chains(direction: str, buckets: Mapping[int, set[str]]) -> list[Chain]:
    """A direction's dispatch chain and its bucket chains."""
    parts = [Chain(f"{direction}_{i}", None, tuple(sorted(b))) for i, b in sorted(buckets.items())]
    return [Chain(direction, None, tuple(f"jump {c.name}" for c in parts)), *parts]
