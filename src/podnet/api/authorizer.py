"""What each identity may do: RBAC-style rules, then the node's content restrictions.

``authorize`` is a pure function of the user and the request, in two steps, as in
kube-apiserver:

1. rules (kube's RBAC and Node authorizer): verb, API group, resource (with its
   subresource, ``pods/status``), optional names and namespace, from the rule table of
   ``podnet.api.roles`` (which says what each role may do). ``rules_for`` lists a user's,
   so ``kubectl auth can-i --list`` shows exactly what is enforced. The rules are built
   once per set of roles and indexed by (verb, group, resource); a node's rules about
   its own Node and Lease compare the name with the caller's at request time, so
   neither memory nor time per request grows with the number of nodes.
2. for a node's writes, ``noderestriction.node_restriction`` looks at the objects
   (NodeRestriction admission): own Node and pods only, mirror pods only, no label
   changes, own Lease only; for a router's, ``routerrestriction.router_restriction``:
   its own ``status.ingress`` entry only.

Non-resource paths are authorized like everything else, by path rules
(``roles.role_path_rules``, kube's ``nonResourceURLs``): everyone authenticated reads
discovery, OpenAPI, version and health (kube's ``system:discovery`` and
``system:public-info-viewer``); ``/metrics`` only the admin and the metrics readers
(kube's ``system:monitoring``). Every authenticated user may ask what it may do
(access reviews).
"""

from __future__ import annotations

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
from podnet.api.roles import AUTHORIZATION_GROUP as AUTHORIZATION_GROUP
from podnet.api.roles import NON_RESOURCE_READ_VERBS as NON_RESOURCE_READ_VERBS
from podnet.api.roles import READ_VERBS as READ_VERBS
from podnet.api.roles import WRITE_VERBS as WRITE_VERBS
from podnet.api.roles import PathRule, role_index, role_path_rules, role_rules, roles_of
from podnet.api.roles import Rule as Rule
from podnet.api.routerrestriction import router_restriction
from podnet.model.errors import ApiError, forbidden
from podnet.model.kinds import Kind


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


def rules_for(user: User) -> tuple[Rule, ...]:
    """Every resource rule that applies to ``user`` (its roles' union), bound to its name."""
    own = user.node_name
    return tuple(rule.bound(own) for rule in role_rules(roles_of(user)))


def allowed_by_rules(
    user: User, verb: str, group: str, resource: str, namespace: str | None, name: str | None
) -> bool:
    """Step 1 alone: what an access review answers (no object is known)."""
    own = user.node_name
    for rule in role_index(roles_of(user)).candidates(verb, group, resource):
        if rule.allows(verb, group, resource, namespace, name, own):
            return True
    return False


def path_rules_for(user: User) -> tuple[PathRule, ...]:
    """Every non-resource rule that applies to ``user``."""
    return role_path_rules(roles_of(user))


def may_access_path(user: User, verb: str, path: str) -> bool:
    """Whether a path rule of ``user`` grants ``verb`` on non-resource ``path``."""
    return any(rule.allows(verb, path) for rule in path_rules_for(user))


def is_resource_path(path: str) -> bool:
    """Whether ``path`` names resources (``/api/v1/pods``, ``/apis/g/v/r``: the handlers
    authorize those by rule and object), as kube's RequestInfo tells them apart; every
    other path is non-resource (discovery ``/api/v1``, ``/metrics`` ...)."""
    parts = [part for part in path.split("/") if part]
    if parts[:1] == ["api"]:
        return len(parts) >= 3
    return parts[:1] == ["apis"] and len(parts) >= 4


def require_path(user: User, method: str, path: str) -> None:
    """Raise 403 for a non-resource request no path rule of ``user`` allows."""
    if is_resource_path(path):
        return
    attrs = RequestAttributes(method.lower(), None, None, None, None, None, None, path)
    reason = authorize(user, attrs)
    if reason is not None:
        raise forbidden_error(user, attrs, reason)


def authorize(user: User, attrs: RequestAttributes) -> str | None:
    """Decide a request: None when allowed, else why it is denied."""
    if attrs.kind is None:
        if may_access_path(user, attrs.verb, attrs.path or "/"):
            return None
        return f"no rule allows {attrs.verb} on the non-resource path {attrs.path or '/'!r}"
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
    if user.is_router and not user.is_admin and attrs.verb not in READ_VERBS:
        return router_restriction(user.router_name, attrs.new_object, attrs.old_object)
    return None


def _denial(user: User, attrs: RequestAttributes) -> str:
    """Why no rule matched, in the words of the rule that came closest."""
    assert attrs.kind is not None
    kind, verb = attrs.kind, attrs.verb
    node = user.node_name
    if user.is_bootstrapper and node is None:
        return "a bootstrapper may only create CertificateSigningRequests and read its own"
    if node is None and not (user.is_proxy or user.is_router or user.is_controllers):
        return (
            "only the admin, nodes, service proxies, routers and the controllers may "
            "access resources"
        )
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
    who = (
        "a node"
        if node is not None
        else "a service proxy"
        if user.is_proxy
        else "a router"
        if user.is_router
        else "the controllers"
    )
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
