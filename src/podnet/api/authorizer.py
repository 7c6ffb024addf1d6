"""What each identity may do: RBAC-style rules, then the node's content restrictions.

``authorize`` is a pure function of the user and the request, in two steps, as in
kube-apiserver:

1. rules (kube's RBAC and Node authorizer): verb, API group, resource (with its
   subresource, ``pods/status``), optional names and namespace. ``rules_for`` lists them,
   so ``kubectl auth can-i --list`` shows exactly what is enforced. The rules are built
   once per set of roles and indexed by (verb, group, resource); a node's rules about
   its own Node and Lease compare the name with the caller's at request time, so
   neither memory nor time per request grows with the number of nodes.
2. for a node's writes, ``noderestriction.node_restriction`` looks at the objects
   (NodeRestriction admission): own Node and pods only, mirror pods only, no label
   changes, own Lease only.

Roles: the admin (group ``system:masters``) may do anything. A node
(``system:node:<name>``, group ``system:nodes``) reads every kind but events and leases,
creates and deletes mirror pods bound to it, updates the status of its pods, creates and
updates its own Node, creates events, and uses its own Lease in ``kube-node-lease``. A
service proxy (group ``system:podnet:proxies``) reads services, endpoints, endpoint
slices and nodes. A router (group ``system:podnet:routers``) reads routes, services and
endpoints and writes route status. Every authenticated user may read non-resource paths
(discovery, OpenAPI, version, metrics) and ask what it may do (access reviews).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podnet.api.identity import User
from podnet.api.noderestriction import (
    LEASE_GROUP,
    LEASE_PLURAL,
    NODE_LEASE_NAMESPACE,
    node_restriction,
)
from podnet.model.errors import ApiError, forbidden
from podnet.model.kinds import KINDS, Kind

READ_VERBS = frozenset({"get", "list", "watch"})
WRITE_VERBS = frozenset({"create", "update", "patch"})
# Non-resource requests carry the lowercase HTTP method as their verb (as in kube).
NON_RESOURCE_READ_VERBS = READ_VERBS | {"head"}
AUTHORIZATION_GROUP = "authorization.k8s.io"
REVIEWS = frozenset({"selfsubjectaccessreviews", "selfsubjectrulesreviews"})
ROUTE_GROUP = "route.openshift.io"
DISCOVERY_GROUP = "discovery.k8s.io"
ALL = "*"


@dataclass(frozen=True)
class RequestAttributes:
    """What a request does, as the authorizer sees it."""

    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    kind: Kind | None  # None for non-resource paths (/api, /apis, /version, /metrics ...)
    namespace: str | None
    name: str | None
    subresource: str | None  # e.g. "status"
    new_object: Mapping[str, Any] | None  # body being written (after patch), if any
    old_object: Mapping[str, Any] | None  # stored object, if any
    path: str = ""

    @property
    def resource(self) -> str:
        """``pods`` or ``pods/status``: what a rule names."""
        plural = self.kind.plural if self.kind else ""
        return f"{plural}/{self.subresource}" if self.subresource else plural


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


def _rule(
    verbs: str,
    group: str,
    resources: str,
    namespace: str | None = None,
    *,
    own: bool = False,
) -> Rule:
    return Rule(
        frozenset(verbs.split()), group, frozenset(resources.split()), frozenset(), namespace, own
    )


# Every authenticated user may ask what it may do, as kube's system:basic-user.
_REVIEW_RULE = _rule("create", AUTHORIZATION_GROUP, " ".join(sorted(REVIEWS)))
_ADMIN_RULES = (_rule("*", ALL, ALL),)


def _readable(skip: frozenset[tuple[str, str]]) -> tuple[Rule, ...]:
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
_NODE_RULES = (
    *_readable(frozenset({("", "events"), (LEASE_GROUP, LEASE_PLURAL)})),
    _rule("create delete", "", "pods"),
    _rule("update patch", "", "pods/status"),
    _rule("create", "", "nodes"),
    _rule("update patch", "", "nodes nodes/status", own=True),
    _rule("create", "", "events"),
    _rule("create", LEASE_GROUP, LEASE_PLURAL, NODE_LEASE_NAMESPACE),
    _rule("get update patch delete", LEASE_GROUP, LEASE_PLURAL, NODE_LEASE_NAMESPACE, own=True),
)
_PROXY_RULES = (
    _rule("get list watch", "", "services endpoints nodes"),
    _rule("get list watch", DISCOVERY_GROUP, "endpointslices"),
)
_ROUTER_RULES = (
    _rule("get list watch", "", "services endpoints"),
    _rule("get list watch", ROUTE_GROUP, "routes routes/status"),
    _rule("update patch", ROUTE_GROUP, "routes/status"),
)

RoleSet = tuple[bool, bool, bool, bool]  # admin, node, proxy, router


def _roles(user: User) -> RoleSet:
    return (user.is_admin, user.node_name is not None, user.is_proxy, user.is_router)


@functools.cache  # 16 role sets at most, whatever the number of nodes
def _role_rules(roles: RoleSet) -> tuple[Rule, ...]:
    admin, node, proxy, router = roles
    if admin:
        return (*_ADMIN_RULES, _REVIEW_RULE)
    return (
        _REVIEW_RULE,
        *(_NODE_RULES if node else ()),
        *(_PROXY_RULES if proxy else ()),
        *(_ROUTER_RULES if router else ()),
    )


@functools.cache
def _role_index(roles: RoleSet) -> RuleIndex:
    return RuleIndex(_role_rules(roles))


def rules_for(user: User) -> tuple[Rule, ...]:
    """Every resource rule that applies to ``user`` (its roles' union), bound to its name."""
    own = user.node_name
    return tuple(rule.bound(own) for rule in _role_rules(_roles(user)))


def allowed_by_rules(
    user: User, verb: str, group: str, resource: str, namespace: str | None, name: str | None
) -> bool:
    """Step 1 alone: what an access review answers (no object is known)."""
    own = user.node_name
    for rule in _role_index(_roles(user)).candidates(verb, group, resource):
        if rule.allows(verb, group, resource, namespace, name, own):
            return True
    return False


def may_read_path(user: User, verb: str) -> bool:
    """Non-resource paths: reads for everyone authenticated, anything for the admin."""
    return user.is_admin or verb in NON_RESOURCE_READ_VERBS


def authorize(user: User, attrs: RequestAttributes) -> str | None:
    """Decide a request: None when allowed, else why it is denied."""
    if attrs.kind is None:
        if may_read_path(user, attrs.verb):
            return None
        return f"only reads are allowed on non-resource path {attrs.path or '/'!r}"
    kind = attrs.kind
    if not allowed_by_rules(
        user, attrs.verb, kind.group, attrs.resource, attrs.namespace, attrs.name
    ):
        return _denial(user, attrs)
    node = user.node_name
    if node is not None and not user.is_admin and attrs.verb not in READ_VERBS:
        return node_restriction(
            node,
            attrs.verb,
            kind,
            attrs.subresource,
            attrs.namespace,
            attrs.new_object,
            attrs.old_object,
        )
    return None


def _denial(user: User, attrs: RequestAttributes) -> str:
    """Why no rule matched, in the words of the rule that came closest."""
    assert attrs.kind is not None
    kind, verb = attrs.kind, attrs.verb
    node = user.node_name
    if node is None and not (user.is_proxy or user.is_router):
        return "only the admin, nodes, service proxies and routers may access resources"
    if node is not None:
        if (kind.group, kind.plural) == ("", "nodes") and verb in WRITE_VERBS:
            return "a node may only modify its own Node"
        if (kind.group, kind.plural) == (LEASE_GROUP, LEASE_PLURAL):
            return (
                f"a node may only use its own Lease ({node}) in the namespace "
                f"{NODE_LEASE_NAMESPACE}"
            )
        if kind.plural == "pods" and verb in ("update", "patch"):
            return (
                "a node may not change a pod's spec or metadata: it may only create and "
                "delete mirror pods bound to it and update pods/status"
            )
        if kind.plural == "events" and verb in READ_VERBS:
            return "a node may not read events"
        if kind.plural == "events":
            return "a node may only create events"
    who = "a node" if node is not None else "a service proxy" if user.is_proxy else "a router"
    return f"{who} may not {verb} {attrs.resource}"


def forbidden_message(user: User, attrs: RequestAttributes, reason: str) -> str:
    """kube-apiserver's wording for a denied request."""
    if attrs.kind is None:
        return (
            f'forbidden: User "{user.name}" cannot {attrs.verb} path '
            f'"{attrs.path or "/"}": {reason}'
        )
    kind = attrs.kind
    resource = f"{kind.plural}.{kind.group}" if kind.group else kind.plural
    subject = f'{resource} "{attrs.name}"' if attrs.name else resource
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    return (
        f'{subject} is forbidden: User "{user.name}" cannot {attrs.verb} resource '
        f'"{attrs.resource}" in API group "{kind.group}" {scope}: {reason}'
    )


def require_rule(user: User, attrs: RequestAttributes) -> None:
    """Raise 403 unless a rule allows the verb on the resource, judged before the stored
    object is read (as kube-apiserver authorizes before storage): a caller with no rule
    for a write learns nothing of whether its target exists. The object checks
    (``node_restriction``) follow in ``require_authorized`` once the objects are known."""
    kind = attrs.kind
    if kind is None or allowed_by_rules(
        user, attrs.verb, kind.group, attrs.resource, attrs.namespace, attrs.name
    ):
        return
    raise forbidden_error(user, attrs, _denial(user, attrs))


def require_authorized(user: User, attrs: RequestAttributes) -> None:
    """Raise 403 Forbidden (with kube's message) unless ``authorize`` allows the request."""
    reason = authorize(user, attrs)
    if reason is not None:
        raise forbidden_error(user, attrs, reason)


def forbidden_error(user: User, attrs: RequestAttributes, reason: str) -> ApiError:
    """The 403 ``ApiError`` for a denied request, with kind and name in its details."""
    err = forbidden(forbidden_message(user, attrs, reason))
    if attrs.kind is not None:
        err.kind = attrs.kind.plural
        err.name = attrs.name
    return err
