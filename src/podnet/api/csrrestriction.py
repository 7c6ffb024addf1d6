"""Who may see and ask for which CertificateSigningRequests (kube's CSR strategy and the
node-bootstrapper role, held to each requester's own requests).

- on create, ``spec.username``, ``groups``, ``uid`` and ``extra`` are the requester's,
  whatever the body said: the approver trusts them; a status in the body is dropped (a
  request is never created Approved, nor with a certificate);
- a node may only ask for a certificate in its own name (``system:node:<name>``);
- a requester other than the admin holds at most ``MAX_PER_REQUESTER`` requests;
- a requester other than the admin reads only its own requests: a list or watch is
  narrowed to them (``own_fields``), a get of another's is refused as if it did not
  exist (403 both ways, so names leak nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podnet.api.identity import User, node_user
from podnet.model import errors
from podnet.model.csr import CsrError, parse_request, subject_of
from podnet.model.kinds import CERTIFICATE_SIGNING_REQUEST as CSR
from podnet.model.kinds import Kind
from podnet.model.selectors import FieldRequirement

OWNER_FIELD = "spec.username"
# How many requests one requester other than the admin may have at a time (they expire:
# podnet.controllers.csrapproval.expired).
MAX_PER_REQUESTER = 32
# spec.extra's key for the node a bootstrap token is bound to (set by the server only).
BOUND_NODE_EXTRA = "podnet.io/bound-node"


def is_csr(kind: Kind | None) -> bool:
    return kind is not None and (kind.group, kind.plural) == (CSR.group, CSR.plural)


def own_fields(user: User, kind: Kind) -> list[FieldRequirement]:
    """The field requirement that narrows a non-admin's CSR list or watch to its own."""
    if not is_csr(kind) or user.is_admin:
        return []
    return [FieldRequirement(OWNER_FIELD, "=", user.name)]


def require_own(user: User, obj: Mapping[str, Any] | None, name: str) -> None:
    """403 unless the admin asks, or ``obj`` exists and was requested by ``user``."""
    if user.is_admin:
        return
    spec = obj.get("spec") if obj is not None else None
    if isinstance(spec, Mapping) and spec.get(OWNER_FIELD.split(".")[1]) == user.name:
        return
    resource = f"{CSR.plural}.{CSR.group}"
    raise errors.forbidden(
        f'{resource} "{name}" is forbidden: User "{user.name}" cannot get resource '
        f'"{CSR.plural}" in API group "{CSR.group}" at the cluster scope: '
        "a requester may only read its own CertificateSigningRequests"
    )


def require_room(user: User, held: int) -> None:
    """429 when ``user`` (not the admin) already holds ``MAX_PER_REQUESTER`` requests."""
    if user.is_admin or held < MAX_PER_REQUESTER:
        return
    raise errors.ApiError(
        f"{user.name} already has {held} CertificateSigningRequests (at most "
        f"{MAX_PER_REQUESTER}); they are removed an hour after they are decided",
        429,
        "TooManyRequests",
    )


def admit_create(user: User, new: dict[str, Any]) -> None:
    """Stamp the requester into the new CSR's spec, drop any status (a request is born
    undecided: approval is ``/approval``'s); a node may only ask in its own name."""
    new.pop("status", None)
    if user.spent:
        raise errors.forbidden(
            f"this bootstrap token got node {user.bound_node}'s certificate already and is "
            "used up: make a new one (podnet adm token create)"
        )
    spec = new.get("spec")
    if not isinstance(spec, dict):
        return  # validation has refused it already
    spec["username"] = user.name
    spec["groups"] = list(user.groups)
    spec.pop("uid", None)
    spec.pop("extra", None)
    if user.bound_node is not None:  # the approver reads it: csrapproval
        spec["extra"] = {BOUND_NODE_EXTRA: [user.bound_node]}
    node = user.node_name
    if node is None or user.is_admin:
        return
    try:
        subject = subject_of(parse_request(str(spec.get("request", ""))))
    except CsrError as exc:
        raise errors.invalid(CSR.kind, "", [errors.FieldError("spec.request", str(exc))]) from exc
    if subject.common_name != node_user(node):
        raise errors.forbidden(
            f'node {node} may only request a certificate for "{node_user(node)}", '
            f'not "{subject.common_name}"'
        )
