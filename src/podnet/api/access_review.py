"""``kubectl auth can-i``: SelfSubjectAccessReview and SelfSubjectRulesReview.

Both answer from the very rules the API enforces (``podnet.api.authorizer``), for the
caller only: a review names no other user, so it reveals nothing but the caller's own
permissions. No object is known in a review, so the answer is the rules' (step 1): a
node "can" create pods, and NodeRestriction then admits only mirror pods bound to it,
exactly as kube answers for a kubelet. Nothing is stored.
"""

from __future__ import annotations

from typing import Any

from podnet.api.authorizer import (
    AUTHORIZATION_GROUP,
    allowed_by_rules,
    may_access_path,
    path_rules_for,
    rules_for,
)
from podnet.api.identity import User
from podnet.model import errors

API_VERSION = f"{AUTHORIZATION_GROUP}/v1"
SSAR = "SelfSubjectAccessReview"
SSRR = "SelfSubjectRulesReview"
RESOURCES = (
    ("selfsubjectaccessreviews", SSAR),
    ("selfsubjectrulesreviews", SSRR),
)


def _spec(body: Any, kind: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a JSON object")
    if body.get("kind") not in (None, kind):
        raise errors.bad_request(f"the body is a {body.get('kind')!s}, but the URL is for {kind}")
    if body.get("apiVersion") not in (None, API_VERSION):
        raise errors.bad_request(f"apiVersion {body.get('apiVersion')!s} is not {API_VERSION}")
    spec = body.get("spec")
    if not isinstance(spec, dict):
        raise errors.invalid(kind, "", [errors.FieldError("spec", "must be an object")])
    return spec


def _text(attrs: dict[str, Any], key: str, kind: str, where: str) -> str:
    value = attrs.get(key) or ""
    if not isinstance(value, str):
        raise errors.invalid(kind, "", [errors.FieldError(f"{where}.{key}", "must be a string")])
    return value


def access_review(user: User, body: Any) -> dict[str, Any]:
    """Answer a SelfSubjectAccessReview (the body, with ``status`` filled in)."""
    spec = _spec(body, SSAR)
    resource, path = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if (resource is None) == (path is None):
        cause = errors.FieldError(
            "spec", "exactly one of resourceAttributes and nonResourceAttributes is required"
        )
        raise errors.invalid(SSAR, "", [cause])
    if isinstance(resource, dict):
        allowed = _resource_allowed(user, resource)
    elif isinstance(path, dict):
        verb = _text(path, "verb", SSAR, "spec.nonResourceAttributes")
        url = _text(path, "path", SSAR, "spec.nonResourceAttributes")
        allowed = may_access_path(user, verb, url)
    else:
        raise errors.invalid(SSAR, "", [errors.FieldError("spec", "attributes must be objects")])
    status: dict[str, Any] = {"allowed": allowed}
    if not allowed:
        status["reason"] = f"no rule for {user.name} allows it"
    return {**body, "apiVersion": API_VERSION, "kind": SSAR, "status": status}


def _resource_allowed(user: User, attrs: dict[str, Any]) -> bool:
    where = "spec.resourceAttributes"
    fields = ("verb", "group", "resource", "subresource", "namespace", "name")
    verb, group, resource, sub, namespace, name = (_text(attrs, f, SSAR, where) for f in fields)
    if not verb or not resource:
        cause = errors.FieldError(where, "verb and resource are required")
        raise errors.invalid(SSAR, "", [cause])
    full = f"{resource}/{sub}" if sub else resource
    return allowed_by_rules(user, verb, group, full, namespace or None, name or None)


def rules_review(user: User, body: Any) -> dict[str, Any]:
    """Answer a SelfSubjectRulesReview: the caller's rules that apply in a namespace."""
    spec = _spec(body, SSRR)
    namespace = spec.get("namespace") or None
    resource_rules = []
    for rule in rules_for(user):
        if rule.namespace is not None and rule.namespace != namespace:
            continue
        entry: dict[str, Any] = {
            "verbs": sorted(rule.verbs),
            "apiGroups": [rule.group],
            "resources": sorted(rule.resources),
        }
        if rule.names:
            entry["resourceNames"] = sorted(rule.names)
        resource_rules.append(entry)
    path_rules = [
        {"verbs": sorted(rule.verbs), "nonResourceURLs": list(rule.paths)}
        for rule in path_rules_for(user)
    ]
    status = {
        "resourceRules": resource_rules,
        "nonResourceRules": path_rules,
        "incomplete": False,
    }
    return {**body, "apiVersion": API_VERSION, "kind": SSRR, "status": status}


def discovery_resources() -> list[dict[str, Any]]:
    """The group's entries for ``GET /apis/authorization.k8s.io/v1``."""
    return [
        {
            "name": plural,
            "singularName": kind.lower(),
            "namespaced": False,
            "kind": kind,
            "verbs": ["create"],
        }
        for plural, kind in RESOURCES
    ]
