"""The master's Route host allocator: a route stored without ``spec.host`` gets one.

OpenShift's route strategy does this: an empty host becomes ``<name>-<namespace>.<suffix>``
(``podnet.model.routenames.generated_host``), the suffix being the cluster's routing
subdomain (``podnet master --route-suffix``, default OpenShift 3's
``router.default.svc.cluster.local``). The registry calls ``allocate`` after validation on
every create and update, as for Services (``podnet.api.serviceallocator``); the name is
derived, not claimed, so there is nothing to release. Two routes asking for the same
host are settled by the router's admission (oldest first), not here.

``DEFAULT_ROUTE_SUFFIX`` and ``suffix_problem`` are re-exported for the master's flags.
"""

from __future__ import annotations

from typing import Any, Protocol

from podnet.model import errors
from podnet.model.kinds import ROUTE
from podnet.model.routenames import (
    DEFAULT_ROUTE_SUFFIX,
    generated_host,
    host_problem,
    suffix_problem,
)
from podnet.model.schemas_names import quote

Obj = dict[str, Any]
__all__ = ["DEFAULT_ROUTE_SUFFIX", "Allocator", "RouteHosts", "suffix_problem"]
REQUIRED = "FieldValueRequired"


class Allocator(Protocol):
    """What the registry calls before it stores an object of a kind that has one
    (``ServiceAllocator``, ``RouteHosts``): the object to store, and the claim paths of
    the values chosen."""

    async def allocate(self, new: Obj, old: Obj | None) -> tuple[Obj, set[str]]: ...


class RouteHosts:
    """Fills the host of routes stored without one."""

    def __init__(self, suffix: str = DEFAULT_ROUTE_SUFFIX) -> None:
        why = suffix_problem(suffix)
        if why:
            raise ValueError(f"route suffix {quote(suffix)}: {why}")
        self.suffix = suffix

    async def allocate(self, new: Obj, old: Obj | None) -> tuple[Obj, set[str]]:
        """``new`` with its host filled when empty (a copy), and no claims. 422 when the
        generated host is not a valid host (a long name and namespace)."""
        spec = new.get("spec") or {}
        if spec.get("host"):
            return new, set()
        meta = new["metadata"]
        host = generated_host(meta["name"], meta["namespace"], self.suffix)
        why = host_problem(host)
        if why:
            message = (
                f"Required value: the generated host {quote(host)} is not valid ({why}); "
                "set spec.host"
            )
            cause = errors.FieldError("spec.host", message, REQUIRED)
            raise errors.invalid(ROUTE.kind, meta["name"], [cause])
        return {**new, "spec": {**spec, "host": host}}, set()
