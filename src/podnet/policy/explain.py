"""Verdicts and reachability for people: the ``podnet trace`` text and a pods x pods grid.

Pure: values in, text out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from podnet.model.network import PLUGIN_ALIASES
from podnet.policy.evaluate import Packet, Verdict, reachability
from podnet.policy.model import RuleSet

ALLOWED_MARK, DENIED_MARK = "✓", "✗"
CORNER = "from \\ to"
_SHORT_MODES = {full: short for short, full in PLUGIN_ALIASES.items()}


def mode_name(plugin: str) -> str:
    """``networkpolicy (redhat/openshift-ovs-networkpolicy)``."""
    short = _SHORT_MODES.get(plugin)
    return f"{short} ({plugin})" if short else plugin


def _vnid_text(vnid: int | None) -> str:
    return "none (no NetNamespace yet)" if vnid is None else str(vnid)


def render_verdict(verdict: Verdict) -> str:
    """The ``podnet trace`` answer: verdict, mode, both VNIDs, allowing rules or the denial."""
    service = Packet.service_text(verdict.protocol, verdict.port)
    head = "ALLOWED" if verdict.allowed else "DENIED"
    lines = [
        f"{head}: {verdict.src} -> {verdict.dst} {service}",
        f"mode: {mode_name(verdict.mode)}",
        f"VNIDs: source {_vnid_text(verdict.src_vnid)}, destination {_vnid_text(verdict.dst_vnid)}",
    ]
    if verdict.allowed_by:
        lines.append(f"allowed by: {', '.join(verdict.allowed_by)}")
    if not verdict.allowed:
        lines.append(f"denied because: {verdict.denied_because}")
    lines.append("why:")
    lines += [f"  {reason}" for reason in verdict.reasons]
    return "\n".join(lines)


def render_matrix(names: Sequence[str], allowed: Mapping[tuple[str, str], bool]) -> str:
    """A grid, one row per source and one column per destination, ✓ allowed, ✗ denied."""
    width = max([len(CORNER), *(len(n) for n in names)])
    column = max([1, *(len(n) for n in names)])
    header = " ".join([CORNER.ljust(width), *(n.ljust(column) for n in names)])
    rows = [header.rstrip()]
    for src in names:
        marks = [_mark(allowed.get((src, dst))).ljust(column) for dst in names]
        rows.append(" ".join([src.ljust(width), *marks]).rstrip())
    return "\n".join(rows)


def _mark(value: bool | None) -> str:
    if value is None:
        return "?"
    return ALLOWED_MARK if value else DENIED_MARK


def render_reachability(ruleset: RuleSet, protocol: str = "TCP", port: int | None = None) -> str:
    """Every pod to every pod of ``ruleset`` for one protocol and port, as a grid."""
    names = sorted(e.key for e in ruleset.endpoints)
    return render_matrix(names, reachability(ruleset, protocol, port))
