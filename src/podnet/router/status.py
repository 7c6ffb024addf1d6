"""A route's ``status.ingress`` entry for one router, as pure functions.

Each router writes one entry, found by its ``routerName``, and leaves the other routers'
entries as they are::

    {"host": "www.example.com", "routerName": "default", "wildcardPolicy": "None",
     "conditions": [{"type": "Admitted", "status": "True",
                     "lastTransitionTime": "2024-01-02T03:04:05Z"}]}

A refused route's condition is ``status: "False"`` with the verdict's reason and
message. ``lastTransitionTime`` is kept while the condition's status stays the same (a
new message alone is not a transition) and set to ``now`` when it changes.

``route_status`` gives the whole new ``status`` (to PUT to ``routes/<name>/status``, or
to send as a merge patch ``{"status": ...}``, which replaces the ingress list), or None
when the stored status already says this: the router then writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podnet.router.admission import Verdict, route_host

Obj = Mapping[str, Any]
ADMITTED = "Admitted"


def _entries(route: Obj) -> list[Obj]:
    status = route.get("status")
    ingress = status.get("ingress") if isinstance(status, Mapping) else None
    return [e for e in ingress or [] if isinstance(e, Mapping)]


def router_entry(route: Obj, router_name: str) -> Obj | None:
    """This router's entry in the route's ``status.ingress``, if it wrote one."""
    return next((e for e in _entries(route) if e.get("routerName") == router_name), None)


def admitted_condition(entry: Obj | None) -> Obj | None:
    """The Admitted condition of an ingress entry, if any."""
    conditions = entry.get("conditions") if entry is not None else None
    found = (c for c in conditions or [] if isinstance(c, Mapping) and c.get("type") == ADMITTED)
    return next(found, None)


def ingress_entry(
    route: Obj,
    router_name: str,
    verdict: Verdict,
    now: str,
    canonical_hostname: str | None = None,
) -> dict[str, Any]:
    """This router's entry for ``route`` given its verdict (``now``: RFC 3339)."""
    status = "True" if verdict.admitted else "False"
    previous = admitted_condition(router_entry(route, router_name))
    since = now
    if previous is not None and previous.get("status") == status:
        since = str(previous.get("lastTransitionTime") or now)
    condition: dict[str, Any] = {"type": ADMITTED, "status": status}
    if not verdict.admitted:
        condition |= {"reason": verdict.reason, "message": verdict.message}
    condition["lastTransitionTime"] = since
    entry: dict[str, Any] = {"host": route_host(route), "routerName": router_name}
    if canonical_hostname:
        entry["routerCanonicalHostname"] = canonical_hostname
    entry |= {"wildcardPolicy": "None", "conditions": [condition]}
    return entry


def route_status(
    route: Obj,
    router_name: str,
    verdict: Verdict,
    now: str,
    canonical_hostname: str | None = None,
) -> dict[str, Any] | None:
    """The route's new ``status`` with this router's entry, or None if unchanged."""
    entry = ingress_entry(route, router_name, verdict, now, canonical_hostname)
    if router_entry(route, router_name) == entry:
        return None
    others = _entries(route)
    mine = [i for i, e in enumerate(others) if e.get("routerName") == router_name]
    ingress = [dict(e) for e in others if e.get("routerName") != router_name]
    ingress.insert(mine[0] if mine else len(ingress), entry)
    return {"ingress": ingress}


def status_without_router(route: Obj, router_name: str) -> dict[str, Any] | None:
    """The route's ``status`` with this router's entry removed (a route it no longer
    serves), or None if it has none."""
    if router_entry(route, router_name) is None:
        return None
    return {"ingress": [dict(e) for e in _entries(route) if e.get("routerName") != router_name]}
