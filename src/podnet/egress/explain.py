"""``podnet trace`` for a destination outside the cluster: what the egress firewall of the
source pod's network decides, with the policy and the rule (pure: from the API's
objects, as every node compiles them in ``podnet.egress.nodetable``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from podnet.egress.firewall import ALLOW, FirewallError, rules_of, verdict
from podnet.egress.nodetable import GLOBAL_VNID

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class FirewallVerdict:
    allowed: bool
    lines: tuple[str, ...]  # what trace prints, after the NetworkPolicy verdict


def _rule_text(rule: Obj) -> str:
    to = rule.get("to") or {}
    target = to.get("cidrSelector") or f"dnsName {to.get('dnsName')}"
    return f"{rule.get('type')} {target}"


def firewall_verdict(
    namespace: str,
    dst: IPv4Address,
    internal: Sequence[IPv4Network],
    vnids: Mapping[str, int],
    policies: Iterable[Obj],
) -> FirewallVerdict | None:
    """The egress firewall's word on a packet from a pod of ``namespace`` to ``dst``; None
    when it has none (``dst`` in the cluster or service networks, no policy applies)."""
    if any(dst in network for network in internal):
        return None
    vnid = vnids.get(namespace)
    if vnid is None or vnid == GLOBAL_VNID:
        return None
    mine = [
        p
        for p in policies
        if vnids.get(str((p.get("metadata") or {}).get("namespace") or "")) == vnid
    ]
    if not mine:
        return None
    names = ", ".join(
        f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}"
        for p in mine
    )
    if len(mine) > 1:
        line = f"egress firewall: DENIED: network {vnid} has {len(mine)} policies ({names}): "
        return FirewallVerdict(False, (line + "every outside destination is denied",))
    try:
        rules = rules_of(mine[0])
    except FirewallError as exc:
        return FirewallVerdict(False, (f"egress firewall {names}: DENIED: {exc} (fails closed)",))
    action, index = verdict(rules, dst)
    if index is None:
        return FirewallVerdict(True, (f"egress firewall {names}: allowed: no rule matches",))
    spec = (mine[0].get("spec") or {}).get("egress") or []
    word = "allowed" if action == ALLOW else "DENIED"
    text = f"egress firewall {names}: {word} by rule {index} ({_rule_text(spec[index])})"
    return FirewallVerdict(action == ALLOW, (text,))
