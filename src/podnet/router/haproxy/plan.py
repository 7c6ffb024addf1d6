"""What a table change needs: nothing, runtime API commands, or a reload (pure).

Only the servers of existing backends can change at run time: a server added, removed, or
given another weight. Anything else (a route added, removed or changed in any other
field) needs a reload. A reencrypt backend that had no server also needs one: its
destination CA is loaded with its first server line, and ``add server`` can only name a
CA file HAProxy has already loaded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from podnet.router.haproxy import maps
from podnet.router.haproxy.config import server_args
from podnet.router.table import RouteBackend, RouterTable, Server

Operation = Literal["add", "remove", "weight"]


@dataclass(frozen=True)
class ServerChange:
    """One server of one route's backend to add, remove or re-weight."""

    operation: Operation
    route: RouteBackend  # the new route (the old one for a removal)
    server: Server

    @property
    def target(self) -> str:
        """``<backend>/<server>`` as the CLI names it."""
        return f"{maps.backend_name(self.route)}/{self.server.name}"


@dataclass(frozen=True)
class Plan:
    """The way from the live table to the desired one."""

    reload_reasons: tuple[str, ...] = ()
    changes: tuple[ServerChange, ...] = ()

    @property
    def reload(self) -> bool:
        return bool(self.reload_reasons)

    @property
    def unchanged(self) -> bool:
        return not self.reload_reasons and not self.changes


@dataclass(frozen=True)
class Command:
    """One CLI command and the answers that mean it worked."""

    text: str
    success: tuple[str, ...] = ("",)
    optional: bool = False  # a failure leaves things usable (a server left to drain)


def _by_key(table: RouterTable) -> dict[str, RouteBackend]:
    return {r.key: r for r in table.routes}


def _servers(route: RouteBackend) -> dict[str, Server]:
    return {s.name: s for s in maps.servers_in_order(route)}


def _route_reason(old: RouteBackend, new: RouteBackend) -> str | None:
    if dataclasses.replace(old, servers=()) != dataclasses.replace(new, servers=()):
        return f"route {new.key} changed"
    if new.termination == "reencrypt" and not old.servers and new.servers:
        return f"route {new.key} got its first server (its CA is loaded then)"
    return None


def _server_changes(old: RouteBackend, new: RouteBackend) -> list[ServerChange]:
    before, after = _servers(old), _servers(new)
    changes = [ServerChange("remove", old, before[n]) for n in sorted(before.keys() - after)]
    for name in sorted(after):
        if name not in before:
            changes.append(ServerChange("add", new, after[name]))
        elif before[name].weight != after[name].weight:
            changes.append(ServerChange("weight", new, after[name]))
    return changes


def plan_update(live: RouterTable | None, desired: RouterTable) -> Plan:
    """The changes from ``live`` (None: nothing runs yet) to ``desired``."""
    if live is None:
        return Plan(reload_reasons=("first configuration",))
    old, new = _by_key(live), _by_key(desired)
    reasons = [f"route {k} added" for k in sorted(new.keys() - old.keys())]
    reasons += [f"route {k} removed" for k in sorted(old.keys() - new.keys())]
    changes: list[ServerChange] = []
    for key in sorted(old.keys() & new.keys()):
        if old[key] == new[key]:  # most routes: cheap, the fields are shared objects
            continue
        reason = _route_reason(old[key], new[key])
        if reason:
            reasons.append(reason)
        else:
            changes += _server_changes(old[key], new[key])
    if reasons:
        return Plan(reload_reasons=tuple(reasons))
    return Plan(changes=tuple(changes))


def commands(change: ServerChange, draining: bool) -> list[Command]:
    """The CLI commands for ``change``. ``draining``: the server is still in the worker,
    in maintenance, left there by an earlier removal whose ``del server`` was refused
    (it had connections); it is brought back rather than added."""
    target = change.target
    weight = Command(f"set server {target} weight {change.server.weight}")
    if change.operation == "weight":
        return [weight]
    if change.operation == "remove":
        # no new requests; the server is deleted once its connections have ended
        return [
            Command(f"set server {target} state maint"),
            Command(f"del server {target}", ("Server deleted.",), optional=True),
        ]
    if draining:
        return [weight, Command(f"set server {target} state ready")]
    added = [
        Command(
            f"add server {target} {server_args(change.route, change.server)}",
            ("New server registered.",),
        ),
        Command(f"enable server {target}"),
    ]
    if change.route.sticky and change.route.termination != "passthrough":
        # a server added at run time gets its dynamic cookie only when this is re-run
        added.append(Command(f"enable dynamic-cookie backend {maps.backend_name(change.route)}"))
    return added
