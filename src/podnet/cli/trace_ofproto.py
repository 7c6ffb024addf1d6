"""``podnet trace --ofproto``: OVS's ``ofproto/trace`` as a second opinion.

For every pair the trace command traces (one pair, each endpoint behind ``svc/NS/NAME``,
every pair of ``--matrix``) the same packet is traced through the switches of the local
cluster (``podnet.cluster.ofprototrace``): the lines name the flows that decided on each
node (table, priority, the object kind its cookie names) and say whether OVS decides as
podnet does. Any difference is a ``DISAGREEMENT`` (exit 3). With ``--probe`` as well,
the real packet is the third opinion and a summary says whether all three agree.

The switches are loaded before anything is printed, so a cluster that does not run the
ovs data plane is one error line (exit 1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import TYPE_CHECKING

from podnet.policy.model import RuleSet

if TYPE_CHECKING:  # OVS's libraries take a second to import: only for --ofproto
    from podnet.cluster.ofprototrace import OfprotoCheck, OfprotoCluster

Pair = tuple[str, str]
Packet = tuple[IPv4Address, IPv4Address, bool]  # src, dst, podnet's verdict


@dataclass(frozen=True)
class Ofproto:
    """The local cluster's switches and the rule set the verdicts came from."""

    cluster: OfprotoCluster
    rules: RuleSet

    @staticmethod
    def load(state_dir: Path, rules: RuleSet) -> Ofproto:
        """TraceError (one line) when the cluster at ``state_dir`` has no switches."""
        from podnet.cluster.ofprototrace import OfprotoCluster

        return Ofproto(asyncio.run(OfprotoCluster.load(state_dir)), rules)

    def check(self, packets: Sequence[Packet], kind: tuple[str, int | None]) -> list[OfprotoCheck]:
        """OVS's verdict next to podnet's for each packet, in order."""
        from podnet.cluster.ofprototrace import checks

        return asyncio.run(checks(self.cluster, self.rules, packets, *kind))


def pair_lines(check: OfprotoCheck) -> list[str]:
    """One pair: the comparison, then the deciding flows per node with their cookies."""
    return [check.line(), *check.decided(detail=True)]


def service_lines(labels: Sequence[str], found: Sequence[OfprotoCheck]) -> list[str]:
    """Each endpoint behind a Service (``labels``: ``ip:port``), as ``pair_lines``."""
    lines = []
    for label, check in zip(labels, found, strict=True):
        lines.append(f"{label}: {check.line()}")
        lines += check.decided(detail=True)
    return lines


def matrix_lines(pairs: Sequence[Pair], found: Sequence[OfprotoCheck]) -> list[str]:
    """Every pair on one line (verdict and the deciding tables per node), then the
    disagreements again and a count."""
    lines = []
    for (src, dst), check in zip(pairs, found, strict=True):
        hops = " | ".join(line.strip() for line in check.decided(detail=False))
        lines.append(f"{src} -> {dst}: {check.line()}" + (f": {hops}" if hops else ""))
    bad = [(pair, c) for pair, c in zip(pairs, found, strict=True) if not c.agrees]
    lines += [f"{s} -> {d}: {c.line()}" for (s, d), c in bad]
    traced = sum(c.ovs is not None for c in found)
    lines.append(
        f"ofproto/trace on {traced} pairs: {traced - len(bad)} agree with podnet, "
        f"{len(bad)} disagree"
    )
    return lines


def three_way(
    ovs: Mapping[Pair, OfprotoCheck], probed: Mapping[Pair, bool]
) -> tuple[list[str], bool]:
    """With ``--probe``: whether podnet, OVS and the real packet agree on every pair
    (``probed``: whether the probe agreed with podnet); the lines and the answer."""
    wrong = sorted(p for p in ovs if not (ovs[p].agrees and probed.get(p, True)))
    lines = [
        f"{s} -> {d}: DISAGREEMENT: podnet, OVS and the probe do not all agree "
        f"(OVS {'agrees' if ovs[(s, d)].agrees else 'differs'}, "
        f"probe {'agrees' if probed.get((s, d), True) else 'differs'})"
        for s, d in wrong
    ]
    lines.append(
        f"three ways (podnet, ofproto/trace, probe): {len(ovs) - len(wrong)} of {len(ovs)} "
        "pairs agree"
    )
    return lines, not wrong
