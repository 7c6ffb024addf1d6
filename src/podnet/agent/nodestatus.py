"""The agent's own Node: the object it registers, its conditions, its reconcile note.

Pure builders for ``status`` (addresses, a condition set only when it changes), and
``ReconcileNote``: the ``podnet.reconcile`` status note published as the Node's
annotation ``podnet.io/reconcile`` (compact JSON, one entry per loop: what was applied,
when, how long, the result, the error and the objects left out). ``podnet cluster
status`` reads it back with ``reconcile_problems``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from ipaddress import IPv4Address
from typing import Any, Protocol

from podnet.model.kinds import NODE, Kind
from podnet.reconcile import APPLIED, StatusNote

Obj = dict[str, Any]
RECONCILE_ANNOTATION = "podnet.io/reconcile"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_object(name: str, ip: IPv4Address) -> Obj:
    """The Node this agent registers."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"addresses": node_addresses(name, ip)},
    }


def node_addresses(name: str, ip: IPv4Address) -> list[Obj]:
    """``status.addresses``: the InternalIP (what the master allocates by) and Hostname."""
    return [{"type": "InternalIP", "address": str(ip)}, {"type": "Hostname", "address": name}]


def with_condition(status: Obj, kind: str, value: str, reason: str, message: str) -> Obj:
    """``status`` with condition ``kind`` set; unchanged when it already says so."""
    conditions = [dict(c) for c in status.get("conditions") or []]
    old = next((c for c in conditions if c.get("type") == kind), None)
    wanted = (value, reason, message)
    if old and (old.get("status"), old.get("reason"), old.get("message")) == wanted:
        return status
    now = _now()
    changed = old is None or old.get("status") != value
    new = {"type": kind, "status": value, "reason": reason, "message": message}
    new["lastHeartbeatTime"] = now
    new["lastTransitionTime"] = now if changed else (old or {}).get("lastTransitionTime", now)
    others = [c for c in conditions if c.get("type") != kind]
    return {**status, "conditions": [*others, new]}


class NodePatcher(Protocol):
    """What the note needs of the API client: a merge patch."""

    async def patch(self, kind: Kind, namespace: str | None, name: str, patch: Obj) -> Obj:
        """Apply a JSON merge patch to an object."""
        ...


def reconcile_note(api: NodePatcher, node: str) -> StatusNote:
    """The status note of this node's loops, published as its annotation."""

    async def publish(text: str) -> None:
        await api.patch(
            NODE, None, node, {"metadata": {"annotations": {RECONCILE_ANNOTATION: text}}}
        )

    return StatusNote(publish)


def reconcile_problems(node: Obj) -> list[str]:
    """What the Node's reconcile note says is wrong, one line per loop (none: all well).

    ``policy: partial, left out shop/bad (nft transaction failed: ...)``."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(RECONCILE_ANNOTATION)
    try:
        note = json.loads(text) if text else {}
    except ValueError:
        return [f"{RECONCILE_ANNOTATION} is not JSON"]
    problems = []
    for loop, entry in sorted(note.items() if isinstance(note, dict) else []):
        if not isinstance(entry, dict) or entry.get("result") == APPLIED:
            continue
        left_out = ", ".join(entry.get("left_out") or [])
        what = f"{loop}: {entry.get('result')}" + (f", left out {left_out}" if left_out else "")
        error = str(entry.get("error") or "").splitlines()
        problems.append(what + (f" ({error[0]})" if error else "") + f" at {entry.get('at')}")
    return problems
