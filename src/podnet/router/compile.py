"""One pass's desired state: admission verdicts and the ``RouterTable``, computed from a
snapshot of the inputs, reusing the previous pass's work for what did not change.

``RouterCompiler.compute(snapshot)`` is ``admission.admit`` over every route plus
``desired.router_table`` over the admitted ones, with two shortcuts that keep a pass
over 10,000 routes cheap when one endpoint changed:

- the verdicts are reused while the routes are the very same objects as last time (the
  inputs replace a route's object whenever it changes);
- a route's ``RouteBackend`` is reused while the route, whether each of its services
  exists, and each service's endpoints are the same objects as last time (the inputs
  make a new endpoints tuple whenever a service's slices change); routes are found by
  object identity, so an unchanged route costs a lookup and a few comparisons.

Routes HAProxy refused (``refuse``, after a bisection) are not admitted while their
spec stays the same (a status write does not count): they claim no host, so a younger
route for the same host is served, as when OpenShift's router refuses a route before
admission. A changed route is tried again.

A compiler is used by one pass at a time (the reconcile loop runs them in order).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from podnet.router.admission import RouteKey, Verdict, admit, route_key
from podnet.router.desired import ServiceEndpoints, ServiceKey, route_backend, route_services
from podnet.router.inputs import Snapshot, routing_part
from podnet.router.table import RouteBackend, RouterTable

RENDER_REJECTED = "ExtendedValidationFailed"  # OpenShift's reason for a route it cannot load
MESSAGE_CHARS = 1000

Obj = Mapping[str, Any]
Dependencies = tuple[tuple[bool, ServiceEndpoints | None], ...]


@dataclass(frozen=True)
class Desired:
    """One pass's result: the table to serve, and every route's admission verdict."""

    table: RouterTable
    verdicts: Mapping[RouteKey, Verdict] = field(default_factory=dict)
    probe: bool = False  # a bisection's cut: checked by HAProxy, not served

    def without(self, left_out: frozenset[str]) -> Desired:
        """The probe of this state without the routes keyed (``ns:name``) in ``left_out``."""
        return Desired(self.served_without(left_out), self.verdicts, probe=True)

    def served_without(self, left_out: frozenset[str]) -> RouterTable:
        """The table without the routes keyed in ``left_out``."""
        return RouterTable(tuple(r for r in self.table.routes if r.key not in left_out))


def final_verdicts(
    desired: Desired, left_out: frozenset[str], error: str
) -> dict[RouteKey, Verdict]:
    """The verdicts after applying: a route HAProxy refused is not admitted, with
    OpenShift's reason and HAProxy's words."""
    found = dict(desired.verdicts)
    for key in desired.verdicts:
        if f"{key[0]}:{key[1]}" in left_out:
            message = f"HAProxy refused the route's configuration: {error}"
            found[key] = Verdict(False, RENDER_REJECTED, message[:MESSAGE_CHARS])
    return found


def _same_objects(one: Sequence[object], other: Sequence[object]) -> bool:
    return len(one) == len(other) and all(a is b for a, b in zip(one, other, strict=True))


def service_keys(route: Obj) -> tuple[ServiceKey, ...]:
    """(namespace, name) of each service a route sends to."""
    namespace = str((route.get("metadata") or {}).get("namespace") or "")
    return tuple((namespace, name) for name, _ in route_services(route.get("spec") or {}))


def _dependencies(keys: tuple[ServiceKey, ...], snapshot: Snapshot) -> Dependencies:
    """What a route's backend is computed from besides the route: per service, whether
    it exists and its endpoints (compared by identity)."""
    return tuple((key in snapshot.services, snapshot.endpoints.get(key)) for key in keys)


def _same_dependencies(one: Dependencies, other: Dependencies) -> bool:
    return len(one) == len(other) and all(
        a[0] == b[0] and a[1] is b[1] for a, b in zip(one, other, strict=True)
    )


@dataclass(frozen=True)
class _Compiled:
    """One route's last backend and what it was computed from."""

    route: Obj
    key: RouteKey
    services: tuple[ServiceKey, ...]
    depends: Dependencies
    backend: RouteBackend | None


@dataclass
class RouterCompiler:
    """Computes ``Desired`` from snapshots (module docstring)."""

    _routes: tuple[Obj, ...] = ()
    _verdicts: dict[RouteKey, Verdict] = field(default_factory=dict)
    # by id() of the route object: the entry holds the object, so the id stays its own
    _compiled: dict[int, _Compiled] = field(default_factory=dict)
    # routes HAProxy refused: what of them it saw (``routing_part``), and the verdict
    _refused: dict[RouteKey, tuple[Any, Verdict]] = field(default_factory=dict)

    def refuse(self, left_out: frozenset[str], error: str) -> None:
        """HAProxy refused the routes keyed (``ns:name``) in ``left_out``, as last
        compiled: until such a route's spec changes (its status may), it is not
        admitted and claims no host."""
        for known in self._compiled.values():
            if f"{known.key[0]}:{known.key[1]}" in left_out:
                message = f"HAProxy refused the route's configuration: {error}"
                refusal = Verdict(False, RENDER_REJECTED, message[:MESSAGE_CHARS])
                self._refused[known.key] = (routing_part(known.route), refusal)

    def compute(self, snapshot: Snapshot) -> Desired:
        """The verdicts of every route and the table of the admitted ones."""
        candidates = self._admission_candidates(snapshot.routes)
        if not _same_objects(candidates, self._routes):
            verdicts = admit(candidates)
            for key, (_, refusal) in self._refused.items():
                verdicts[key] = refusal
            self._routes, self._verdicts = candidates, verdicts
        compiled: dict[int, _Compiled] = {}
        for route in candidates:
            known = self._compiled.get(id(route))
            if known is None or known.route is not route:
                keys = service_keys(route)
                known = _Compiled(route, route_key(route), keys, (), None)
            if not self._verdicts[known.key].admitted:
                continue
            depends = _dependencies(known.services, snapshot)
            if known.backend is None or not _same_dependencies(known.depends, depends):
                backend = route_backend(route, snapshot.services, snapshot.endpoints)
                known = _Compiled(route, known.key, known.services, depends, backend)
            compiled[id(route)] = known
        self._compiled = compiled
        table = RouterTable(tuple(c.backend for c in compiled.values() if c.backend is not None))
        return Desired(table, self._verdicts)

    def _admission_candidates(self, routes: tuple[Obj, ...]) -> tuple[Obj, ...]:
        """The routes but those HAProxy refused as they are now (one whose spec changed,
        or that was deleted, is forgotten: it is tried again)."""
        if not self._refused:
            return routes
        refused: dict[RouteKey, tuple[Any, Verdict]] = {}
        candidates = []
        for route in routes:
            key = route_key(route)
            entry = self._refused.get(key)
            if entry is not None and entry[0] == routing_part(route):
                refused[key] = entry
            else:
                candidates.append(route)
        self._refused = refused
        return tuple(candidates)
