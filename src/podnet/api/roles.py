"""The rule table: what each role may do, as RBAC-style rules (kube's RBAC and Node
authorizer roles), indexed for the authorizer (``podnet.api.authorizer``).

A ``Rule`` grants verbs on an API group's resources (with a subresource: ``pods/status``),
optionally only some names or one namespace. A role is a tuple of rules; a user's roles
come from its groups (``roles_of``) and their union is built and indexed once per set of
roles (``role_rules``, ``role_index``), whatever the number of users.

Roles:

- the admin (group ``system:masters``): anything;
- a node (``system:node:<name>`` in ``system:nodes``): reads every kind but events,
  leases and routes (a route may hold a TLS key), creates and deletes mirror pods,
  updates its pods' status, creates and updates its own Node, creates events, uses its
  own Lease in ``kube-node-lease`` (its writes are then checked object by object:
  ``podnet.api.noderestriction``);
- a service proxy (group ``system:podnet:proxies``): reads services, endpoints, endpoint
  slices and nodes;
- a router (user ``system:podnet:router:<name>`` in group ``system:podnet:routers``,
  ``podnet router-credentials``): reads routes (their TLS keys included), services,
  endpoints and endpoint slices in every namespace, and writes ``routes/status`` only:
  not a route's spec, not secrets, not pods;
- the controllers (group ``system:podnet:controllers``; the master's own controllers act
  as it too): exactly the reads and writes each controller job makes
  (``CONTROLLER_JOBS``), then ControllerRestriction;
- a metrics reader (kube's group ``system:monitoring``): ``/metrics`` and health;
- a bootstrapper (a bootstrap token, group ``system:bootstrappers``): creates
  CertificateSigningRequests and reads its own, nothing else; a node too asks for its
  own renewal (``podnet.api.csrrestriction``); approving is the admin's;
- everyone authenticated: access reviews (what may I do?), discovery, OpenAPI, version
  and health (kube's ``system:discovery`` and ``system:public-info-viewer``); the
  non-resource rules are ``PathRule``s (``role_path_rules``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from podnet.api.identity import User
from podnet.api.noderestriction import LEASE_GROUP, LEASE_PLURAL, NODE_LEASE_NAMESPACE
from podnet.model.kinds import KINDS
from podnet.model.schemas_coordination import CONTROLLERS_LEASE_NAME, CONTROLLERS_LEASE_NAMESPACE

READ_VERBS = frozenset({"get", "list", "watch"})
WRITE_VERBS = frozenset({"create", "update", "patch"})
NON_RESOURCE_READ_VERBS = READ_VERBS | {"head"}
AUTHORIZATION_GROUP = "authorization.k8s.io"
REVIEWS = frozenset({"selfsubjectaccessreviews", "selfsubjectrulesreviews"})
ROUTE_GROUP = "route.openshift.io"
DISCOVERY_GROUP = "discovery.k8s.io"
NETWORK_GROUP = "network.openshift.io"
NETWORKING_GROUP = "networking.k8s.io"
CERTIFICATES_GROUP = "certificates.k8s.io"
CSRS = "certificatesigningrequests"
EVENT_NAMESPACE = "default"  # where the controllers record events about nodes
ALL = "*"


@dataclass(frozen=True)
class Rule:
    """One RBAC-style policy rule: an empty ``names`` means any name.

    ``own_name`` marks a role's rule that is about the caller's own object (a node's
    Node and Lease): the name must be the caller's node name. Such a rule is written
    once for every node; ``bound`` gives the plain rule of one node."""

    verbs: frozenset[str]
    group: str
    resources: frozenset[str]
    names: frozenset[str] = frozenset()
    namespace: str | None = None  # None: every namespace (and cluster scope)
    own_name: bool = False

    def allows(
        self,
        verb: str,
        group: str,
        resource: str,
        namespace: str | None,
        name: str | None,
        own: str | None = None,
    ) -> bool:
        """Whether this rule grants ``verb`` on ``group/resource`` (name, namespace) to
        a caller whose own name is ``own``."""
        return (
            (verb in self.verbs or ALL in self.verbs)
            and self.group in (ALL, group)
            and (ALL in self.resources or resource in self.resources)
            and (not self.names or name in self.names)
            and (not self.own_name or (name is not None and name == own))
            and (self.namespace is None or self.namespace == namespace)
        )

    @property
    def wildcard(self) -> bool:
        """Whether the verb, group or resource is ``*``."""
        return ALL in self.verbs or self.group == ALL or ALL in self.resources

    def bound(self, own: str | None) -> Rule:
        """This rule for the caller named ``own``: ``own_name`` becomes ``names``."""
        if not self.own_name or own is None:
            return self
        return Rule(self.verbs, self.group, self.resources, frozenset({own}), self.namespace)


class RuleIndex:
    """A role set's rules by (verb, group, resource), built once: a request checks only
    the rules under its own key, and those with a wildcard (the admin's)."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        exact: dict[tuple[str, str, str], list[Rule]] = {}
        for rule in rules:
            if rule.wildcard:
                continue
            for verb in rule.verbs:
                for resource in rule.resources:
                    exact.setdefault((verb, rule.group, resource), []).append(rule)
        self._exact = {key: tuple(found) for key, found in exact.items()}
        self._wildcards = tuple(rule for rule in rules if rule.wildcard)

    def candidates(self, verb: str, group: str, resource: str) -> tuple[Rule, ...]:
        """The rules that may grant ``verb`` on ``group/resource``: those that name
        exactly these, then those with a wildcard."""
        return self._exact.get((verb, group, resource), ()) + self._wildcards


def grant(
    verbs: str,
    group: str,
    resources: str,
    namespace: str | None = None,
    *,
    own: bool = False,
) -> Rule:
    """A rule from space-separated verbs and resources."""
    return Rule(
        frozenset(verbs.split()), group, frozenset(resources.split()), frozenset(), namespace, own
    )


# Every authenticated user may ask what it may do, as kube's system:basic-user.
REVIEW_RULE = grant("create", AUTHORIZATION_GROUP, " ".join(sorted(REVIEWS)))
ADMIN_RULES = (grant("*", ALL, ALL),)


def readable(skip: frozenset[tuple[str, str]]) -> tuple[Rule, ...]:
    """get/list/watch on every served kind (and its subresources) but ``skip``."""
    by_group: dict[str, set[str]] = {}
    for kind in KINDS.kinds:
        if (kind.group, kind.plural) in skip:
            continue
        names = by_group.setdefault(kind.group, set())
        names.add(kind.plural)
        names.update(f"{kind.plural}/{sub}" for sub in kind.subresources)
    return tuple(Rule(READ_VERBS, g, frozenset(r)) for g, r in sorted(by_group.items()))


# One set for every node: "own" rules compare the name with the caller's at request time.
NODE_RULES = (
    *readable(
        frozenset(
            {
                ("", "events"),
                (LEASE_GROUP, LEASE_PLURAL),
                (ROUTE_GROUP, "routes"),
                (CERTIFICATES_GROUP, CSRS),
            }
        )
    ),
    grant("create get list watch", CERTIFICATES_GROUP, CSRS),  # its own: csrrestriction
    grant("create delete", "", "pods"),
    grant("update patch", "", "pods/status"),
    grant("create", "", "nodes"),
    grant("update patch", "", "nodes nodes/status", own=True),
    grant("create", "", "events"),
    grant("create", LEASE_GROUP, LEASE_PLURAL, NODE_LEASE_NAMESPACE),
    grant("get update patch delete", LEASE_GROUP, LEASE_PLURAL, NODE_LEASE_NAMESPACE, own=True),
)
# A bootstrap token (kube's system:node-bootstrapper, narrowed): ask for a certificate
# and read its own requests (``podnet.api.csrrestriction``), nothing else.
BOOTSTRAPPER_RULES = (grant("create get list watch", CERTIFICATES_GROUP, CSRS),)
PROXY_RULES = (
    grant("get list watch", "", "services endpoints nodes"),
    grant("get list watch", DISCOVERY_GROUP, "endpointslices"),
)
ROUTER_RULES = (
    grant("get list watch", "", "services endpoints"),
    grant("get list watch", DISCOVERY_GROUP, "endpointslices"),
    grant("get list watch", ROUTE_GROUP, "routes routes/status"),
    grant("update patch", ROUTE_GROUP, "routes/status"),
)

# The master's controllers, split by job as kube-controller-manager's roles are
# (``system:controller:<name>``): what each controller reads and writes, and nothing
# else (no Node or pod spec writes, no tokens, no ClusterNetwork delete). The jobs share
# one identity today (group ``system:podnet:controllers``, the union below); what a
# rule cannot say, ControllerRestriction (``podnet.api.controllerrestriction``) checks
# per job, object by object: the endpoints controller writes only the Endpoints and
# EndpointSlices it manages, of Services with a selector, with pods' addresses; the
# namespace controller deletes only in Namespaces that are terminating (or gone); no
# controller deletes anything else in a live Namespace, a NetworkPolicy included.
CONTROLLER_JOBS: dict[str, tuple[Rule, ...]] = {
    # the ClusterNetwork, made to agree with the configuration (HostSubnets follow it)
    "clusternetwork": (grant("get list watch create update", NETWORK_GROUP, "clusternetworks"),),
    # a subnet per node, and the NetworkUnavailable condition
    "hostsubnets": (
        grant("get list watch create update delete", NETWORK_GROUP, "hostsubnets"),
        grant("get list watch", "", "nodes"),
        grant("update", "", "nodes/status"),
    ),
    # a VNID per namespace (multitenant, networkpolicy)
    "netnamespaces": (
        grant("get list watch create update delete", NETWORK_GROUP, "netnamespaces"),
        grant("get list watch", "", "namespaces"),
    ),
    # Namespaces default and kube-node-lease; a deleted one's contents, then itself
    "namespace": (
        grant("get list watch create", "", "namespaces"),
        grant("update", "", "namespaces/finalize"),
        grant("list watch delete", "", "pods services"),
        grant("list delete", "", "events endpoints"),
        grant("list delete", DISCOVERY_GROUP, "endpointslices"),
        grant("list delete", LEASE_GROUP, LEASE_PLURAL),
        grant("list delete", NETWORKING_GROUP, "networkpolicies"),
        grant("list delete", NETWORK_GROUP, "egressnetworkpolicies"),
        grant("list delete", ROUTE_GROUP, "routes"),
    ),
    # Ready from the Lease heartbeats, and events about nodes
    "node-lifecycle": (
        grant("get list watch", "", "nodes"),
        grant("update", "", "nodes/status"),
        grant("list watch", LEASE_GROUP, LEASE_PLURAL),
        grant("create", "", "events", EVENT_NAMESPACE),
    ),
    # Endpoints and EndpointSlices of selector Services (slices mirrored for the others)
    "endpoints": (
        grant("list watch", "", "services pods"),
        grant("get list watch create update delete", "", "endpoints"),
        grant("get list watch create update delete", DISCOVERY_GROUP, "endpointslices"),
    ),
    # leader election: the one Lease of the controllers
    "leader-election": (
        grant("create", LEASE_GROUP, LEASE_PLURAL, CONTROLLERS_LEASE_NAMESPACE),
        Rule(
            frozenset({"get", "update"}),
            LEASE_GROUP,
            frozenset({LEASE_PLURAL}),
            frozenset({CONTROLLERS_LEASE_NAME}),
            CONTROLLERS_LEASE_NAMESPACE,
        ),
    ),
}
CONTROLLERS_RULES = tuple(rule for rules in CONTROLLER_JOBS.values() for rule in rules)


@dataclass(frozen=True)
class PathRule:
    """A non-resource rule (kube's ``nonResourceURLs``): verbs on paths, each exact or a
    prefix ending in ``*``."""

    verbs: frozenset[str]
    paths: tuple[str, ...]

    def allows(self, verb: str, path: str) -> bool:
        """Whether this rule grants ``verb`` on ``path``."""
        if verb not in self.verbs and ALL not in self.verbs:
            return False
        return any(path.startswith(p[:-1]) if p.endswith(ALL) else path == p for p in self.paths)


def paths(verbs: str, urls: str) -> PathRule:
    """A path rule from space-separated verbs and paths."""
    return PathRule(frozenset(verbs.split()), tuple(urls.split()))


# kube's system:public-info-viewer (anyone, even unauthenticated), system:discovery
# (everyone authenticated) and system:monitoring (the admin; group system:monitoring).
# Non-resource requests carry the lowercase HTTP method as their verb (as in kube).
PUBLIC_INFO_RULE = paths(
    "get head", "/healthz /livez /readyz /leaderz /version /version/ /cluster-info"
)
DISCOVERY_RULE = paths("get head", "/api /api/* /apis /apis/* /openapi /openapi/*")
MONITORING_RULE = paths("get head", "/metrics /healthz /livez /readyz /leaderz")
ADMIN_PATH_RULE = paths("*", "*")
# A bootstrap token may read the sealed keys a further master joins with
# (podnet.api.controlplanecerts; the handler refuses a token bound to a node).
CONTROL_PLANE_CERTS_RULE = paths("get", "/control-plane-certs")

# admin, node, service proxy, router, controllers, metrics reader, bootstrapper
RoleSet = tuple[bool, bool, bool, bool, bool, bool, bool]


def roles_of(user: User) -> RoleSet:
    """Which roles ``user``'s name and groups give it. A bootstrap token's user has the
    bootstrapper's role alone, whatever other groups it claims."""
    if user.is_bootstrapper:
        return (False, False, False, False, False, False, True)
    node = user.node_name is not None
    return (
        user.is_admin,
        node,
        user.is_proxy,
        user.is_router,
        user.is_controllers,
        user.is_monitoring,
        user.is_bootstrapper,
    )


@functools.cache  # 128 role sets at most, whatever the number of nodes
def role_rules(roles: RoleSet) -> tuple[Rule, ...]:
    """The union of the rules of ``roles``."""
    admin, node, proxy, router, controllers, _, bootstrapper = roles
    if admin:
        return (*ADMIN_RULES, REVIEW_RULE)
    return (
        REVIEW_RULE,
        *(NODE_RULES if node else ()),
        *(PROXY_RULES if proxy else ()),
        *(ROUTER_RULES if router else ()),
        *(CONTROLLERS_RULES if controllers else ()),
        *(BOOTSTRAPPER_RULES if bootstrapper else ()),
    )


@functools.cache
def role_path_rules(roles: RoleSet) -> tuple[PathRule, ...]:
    """The non-resource rules of ``roles``: everyone authenticated has discovery and the
    public information; ``/metrics`` is the admin's and the metrics readers'."""
    if roles[0]:
        return (ADMIN_PATH_RULE,)
    return (
        PUBLIC_INFO_RULE,
        DISCOVERY_RULE,
        *((MONITORING_RULE,) if roles[5] else ()),
        *((CONTROL_PLANE_CERTS_RULE,) if roles[6] else ()),
    )


@functools.cache
def role_index(roles: RoleSet) -> RuleIndex:
    """``role_rules`` indexed by (verb, group, resource)."""
    return RuleIndex(role_rules(roles))
