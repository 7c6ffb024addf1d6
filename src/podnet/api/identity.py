"""The identities the API knows: who a caller is, by user name and groups.

Names and groups follow Kubernetes where it has one (``system:masters``, a node's
``system:node:<name>`` in ``system:nodes``); the service proxy, the router and the
controllers run as their own process are podnet's own groups, one user per node, router
or controllers instance; a metrics reader is in kube's ``system:monitoring``.
"""

from __future__ import annotations

from dataclasses import dataclass

ADMIN_USER = "admin"
MASTERS_GROUP = "system:masters"
NODES_GROUP = "system:nodes"
NODE_USER_PREFIX = "system:node:"
PROXIES_GROUP = "system:podnet:proxies"
PROXY_USER_PREFIX = "system:podnet:proxy:"
ROUTERS_GROUP = "system:podnet:routers"
ROUTER_USER_PREFIX = "system:podnet:router:"
CONTROLLERS_GROUP = "system:podnet:controllers"
CONTROLLERS_USER_PREFIX = "system:podnet:controllers:"
MONITORING_GROUP = "system:monitoring"  # kube's group of /metrics readers
BOOTSTRAPPERS_GROUP = "system:bootstrappers"  # a bootstrap token: may only ask for a cert
BOOTSTRAP_USER_PREFIX = "system:bootstrap:"  # + the token's public id


@dataclass(frozen=True)
class User:
    """An authenticated caller."""

    name: str  # "admin", or "system:node:<nodename>"
    groups: tuple[str, ...]  # admin: ("system:masters",); node: ("system:nodes",)
    # A bootstrap token's node: the only node it may ask a certificate for (None: any).
    bound_node: str | None = None
    # A node-bound bootstrap token whose node has its certificate: it may ask for no more.
    spent: bool = False

    @property
    def node_name(self) -> str | None:
        """The node this user acts for, or None when it is not a node user."""
        if NODES_GROUP not in self.groups or not self.name.startswith(NODE_USER_PREFIX):
            return None
        return self.name[len(NODE_USER_PREFIX) :] or None

    @property
    def is_admin(self) -> bool:
        return MASTERS_GROUP in self.groups

    @property
    def is_proxy(self) -> bool:
        """A service proxy: reads services, endpoints, endpoint slices and nodes."""
        return PROXIES_GROUP in self.groups

    @property
    def is_router(self) -> bool:
        """A router: reads routes, services and endpoints, writes route status."""
        return ROUTERS_GROUP in self.groups

    @property
    def router_name(self) -> str | None:
        """The router this user acts for (its routerName in route status), or None."""
        if not self.is_router or not self.name.startswith(ROUTER_USER_PREFIX):
            return None
        return self.name[len(ROUTER_USER_PREFIX) :] or None

    @property
    def is_controllers(self) -> bool:
        """The master's controllers run as their own process: exactly what they use."""
        return CONTROLLERS_GROUP in self.groups

    @property
    def is_bootstrapper(self) -> bool:
        """A bootstrap token's user (``system:bootstrap:<id>``, ``system:bootstrappers``):
        may only create and read its own CSRs, whatever else it claims."""
        return BOOTSTRAPPERS_GROUP in self.groups or self.name.startswith(BOOTSTRAP_USER_PREFIX)

    @property
    def is_monitoring(self) -> bool:
        """A metrics reader (kube's ``system:monitoring``): ``/metrics`` and health."""
        return MONITORING_GROUP in self.groups


def node_user(node: str) -> str:
    """The user name a node authenticates as."""
    return f"{NODE_USER_PREFIX}{node}"


def controllers_user(name: str) -> User:
    """The controllers' identity for instance ``name`` (the master's own controllers act
    as it too, so they are held to the same rules as ``podnet controllers``)."""
    return User(f"{CONTROLLERS_USER_PREFIX}{name}", (CONTROLLERS_GROUP,))
