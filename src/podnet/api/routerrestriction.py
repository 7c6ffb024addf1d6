"""What a router may write in a route's status: its own ``status.ingress`` entry only.

The rules (``podnet.api.roles.ROUTER_RULES``) let a router identity update and patch
``routes/status`` and nothing else; the status subresource already keeps the spec and
metadata. This check, like NodeRestriction for nodes, looks at the objects: router
``system:podnet:router:<name>`` may add, change or remove the entry whose ``routerName``
is ``<name>``, and must leave every other router's entry as it was, in its order. So a
stolen router token cannot mark routes admitted or refused in another router's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = Mapping[str, Any]


def _ingress(obj: Obj | None) -> list[Any]:
    status = obj.get("status") if isinstance(obj, Mapping) else None
    ingress = status.get("ingress") if isinstance(status, Mapping) else None
    return list(ingress) if isinstance(ingress, list) else []


def _others(obj: Obj | None, router: str) -> list[Any]:
    return [
        e for e in _ingress(obj) if not (isinstance(e, Mapping) and e.get("routerName") == router)
    ]


def router_restriction(router: str | None, new: Obj | None, old: Obj | None) -> str | None:
    """Why router ``router`` may not write ``new`` over ``old`` (a route's status), or
    None when it may. ``router`` is None for a router identity without a router name."""
    if router is None:
        return "a router's user name must be system:podnet:router:<name>"
    if new is None:
        return None  # judged again once the objects are known
    if _others(new, router) != _others(old, router):
        return (
            f'a router may only write its own status.ingress entry (routerName "{router}"); '
            "other routers' entries must stay as they are"
        )
    mine = len(_ingress(new)) - len(_others(new, router))
    if mine > 1:
        return f'a route\'s status.ingress may hold one entry for router "{router}", not {mine}'
    return None
