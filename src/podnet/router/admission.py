"""Route admission: which Routes a router serves, as a pure function of all the Routes.

OpenShift's router rules (``controller/unique_host.go``), applied to the Routes as the
API returns them (dicts):

- Routes are taken oldest first, ordered by ``(metadata.creationTimestamp,
  metadata.uid)``; the order of the input does not matter.
- The oldest admitted route with a host makes its namespace the host's owner: a route
  in another namespace with the same host is not admitted, whatever its path.
- Within the owner namespace, the oldest route wins a host + path; a younger route with
  the same host and path is not admitted. The same host with another path is fine.
- A route without a host (the master fills one in, so only a hand-written object can
  lack it) is not admitted.

A route that is not admitted claims nothing, so it never keeps a younger route out.
Refusals carry OpenShift's reasons: ``HostAlreadyClaimed``, ``NoHostValue``.
``podnet.router.status`` turns a ``Verdict`` into the route's ``status.ingress`` entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]
RouteKey = tuple[str, str]  # (namespace, name)

HOST_ALREADY_CLAIMED = "HostAlreadyClaimed"
NO_HOST_VALUE = "NoHostValue"


@dataclass(frozen=True)
class Verdict:
    """Whether one route is admitted, and if not, why (OpenShift's reason and a message)."""

    admitted: bool
    reason: str = ""
    message: str = ""


ADMITTED = Verdict(True)


def _mapping(value: Any) -> Obj:
    if isinstance(value, dict):  # what the API gives; the ABC check is 3x slower
        return value
    return value if isinstance(value, Mapping) else {}


def route_key(route: Obj) -> RouteKey:
    """``(namespace, name)`` of a route."""
    meta = _mapping(route.get("metadata"))
    return (str(meta.get("namespace") or ""), str(meta.get("name")))


def age(route: Obj) -> tuple[str, str, str, str]:
    """The order of admission: creationTimestamp, then uid (as OpenShift), then the
    namespace and name so that the order is total even for objects without a uid."""
    meta = _mapping(route.get("metadata"))
    namespace, name = route_key(route)
    return (str(meta.get("creationTimestamp") or ""), str(meta.get("uid") or ""), namespace, name)


def route_host(route: Obj) -> str:
    """The route's host, lower case ("" when it has none)."""
    return str(_mapping(route.get("spec")).get("host") or "").lower()


def route_path(route: Obj) -> str:
    """The route's path ("" when it has none; passthrough routes have none)."""
    spec = _mapping(route.get("spec"))
    if _mapping(spec.get("tls")).get("termination") == "passthrough":
        return ""
    return str(spec.get("path") or "")


def _facts(route: Obj) -> tuple[tuple[str, str, str, str], str, str]:
    """What admission reads of a route, once: its age (which ends with its key), host
    and path."""
    return age(route), route_host(route), route_path(route)


def _where(host: str, path: str) -> str:
    return f"{host}{path}" if path else host


def admit(routes: Iterable[Obj]) -> dict[RouteKey, Verdict]:
    """Every route's verdict, keyed by ``(namespace, name)``. Admission does not depend
    on the router: every router with the same routes admits the same ones."""
    owners: dict[str, RouteKey] = {}  # host -> the oldest admitted route holding it
    claims: dict[tuple[str, str], RouteKey] = {}  # (host, path) -> the route serving it
    out: dict[RouteKey, Verdict] = {}
    for order, host, path in sorted(_facts(r) for r in routes):
        key = (order[2], order[3])
        if not host:
            out[key] = Verdict(False, NO_HOST_VALUE, "no host value was defined for the route")
            continue
        owner = owners.setdefault(host, key)
        holder = claims.get((host, path))
        if owner[0] != key[0]:
            why = (
                f"host {host} is owned by namespace {owner[0]}: its route {owner[1]} is older "
                f"than this one"
            )
            out[key] = Verdict(False, HOST_ALREADY_CLAIMED, why)
        elif holder is not None:
            why = f"route {holder[1]} already exposes {_where(host, path)} and is older"
            out[key] = Verdict(False, HOST_ALREADY_CLAIMED, why)
        else:
            claims[(host, path)] = key
            out[key] = ADMITTED
    return out


def admitted_routes(routes: Iterable[Obj]) -> list[Obj]:
    """The admitted routes among ``routes``, oldest first."""
    ordered = sorted(routes, key=age)
    verdicts = admit(ordered)
    return [r for r in ordered if verdicts[route_key(r)].admitted]
