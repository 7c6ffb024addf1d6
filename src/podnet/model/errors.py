"""API errors, one tree, rendered as Kubernetes ``Status`` objects.

Every failure the API reports is an ``ApiError``; its ``status()`` is the body the server
sends, with the HTTP code kube-apiserver would use for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FieldError:
    """One invalid field: a dotted path (``spec.subnet``), the reason, and the bad value."""

    field: str
    message: str
    reason: str = "FieldValueInvalid"

    def cause(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass
class ApiError(Exception):
    """Base of every API failure."""

    message: str
    code: int = 500
    reason: str = "InternalError"
    kind: str | None = None
    name: str | None = None
    causes: list[FieldError] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def status(self) -> dict[str, Any]:
        """The ``Status`` object for this error."""
        details: dict[str, Any] = {}
        if self.name is not None:
            details["name"] = self.name
        if self.kind is not None:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = [c.cause() for c in self.causes]
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if details:
            body["details"] = details
        return body


def bad_request(message: str) -> ApiError:
    return ApiError(message, 400, "BadRequest")


def unauthorized(message: str = "Unauthorized") -> ApiError:
    return ApiError(message, 401, "Unauthorized")


def forbidden(message: str) -> ApiError:
    return ApiError(message, 403, "Forbidden")


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(f'{resource} "{name}" not found', 404, "NotFound", resource, name)


def already_exists(resource: str, name: str) -> ApiError:
    return ApiError(f'{resource} "{name}" already exists', 409, "AlreadyExists", resource, name)


def conflict(resource: str, name: str, why: str) -> ApiError:
    return ApiError(
        f'Operation cannot be fulfilled on {resource} "{name}": {why}',
        409,
        "Conflict",
        resource,
        name,
    )


def gone(message: str) -> ApiError:
    return ApiError(message, 410, "Expired")


def too_large(message: str) -> ApiError:
    return ApiError(message, 413, "RequestEntityTooLarge")


def unsupported_media_type(message: str) -> ApiError:
    return ApiError(message, 415, "UnsupportedMediaType")


def method_not_allowed(message: str) -> ApiError:
    return ApiError(message, 405, "MethodNotAllowed")


def invalid(kind: str, name: str, causes: list[FieldError]) -> ApiError:
    """422: the object failed validation; the message names each field and why."""
    joined = ", ".join(str(c) for c in causes)
    return ApiError(
        f'{kind} "{name}" is invalid: {joined}', 422, "Invalid", kind, name, list(causes)
    )


def unavailable(message: str) -> ApiError:
    return ApiError(message, 503, "ServiceUnavailable")


def resource_version_too_large(requested: int, current: int) -> ApiError:
    """504 for a resourceVersion the store has not reached, as kube-apiserver answers it."""
    cause = FieldError("", "Too large resource version", "ResourceVersionTooLarge")
    return ApiError(
        f"Too large resource version: {requested}, current: {current}",
        504,
        "Timeout",
        causes=[cause],
    )
