"""Every failure of the podnet API clients, as one exception tree.

The same tree serves the synchronous client (the CLI), the asyncio client (the node agent,
controllers running as their own process) and the in-process object API of the master,
which translates ``podnet.model.errors.ApiError`` with ``error_from_status``. Whether a
failure is worth retrying is explicit: each class says ``transient``, and
``is_transient(exc)`` answers for any exception.

::

    ClientError                 base; code (HTTP status, 0 without an answer), reason, message
    ├── ClientConfigError       the client configuration cannot be used (a CA that is not PEM)
    ├── UnknownKind             a kind name the kind table does not know
    ├── TransportError          no answer at all; ``server`` names whom we tried
    │   ├── Unreachable         TRANSIENT: refused, reset, dropped or timed out
    │   └── TLSFailure          the TLS handshake failed (for example an unknown CA)
    └── StatusError             the server answered with an error ``Status``; details
        ├── ServerError         TRANSIENT: 5xx or 429 Too Many Requests
        │   └── InvalidResponse TRANSIENT: the answer was not the JSON expected
        ├── Expired             410 Gone: the resourceVersion is too old; list again
        ├── NotFound            404
        ├── AlreadyExists       409 AlreadyExists
        └── Conflict            409 Conflict: a stale resourceVersion precondition

Every class not marked TRANSIENT is permanent: retrying the same request will not help.
Every constructor (and ``error_from_status``) takes the message first, then the HTTP
code, then the reason, as ``podnet.model.errors.ApiError`` does on the server side.
``Expired`` is permanent for the request that got it; the cure is a new listing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ClientError(Exception):
    """Base of every failure of the API clients."""

    transient: ClassVar[bool] = False

    def __init__(self, message: str, code: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason


class ClientConfigError(ClientError):
    """The client configuration cannot be used."""


class UnknownKind(ClientError):
    """The kind name is not in the kind table."""

    def __init__(self, name: str) -> None:
        super().__init__(f'the server doesn\'t have a resource type "{name}"')
        self.name = name


class TransportError(ClientError):
    """The server gave no answer; ``why`` is the cause in one line."""

    def __init__(self, server: str, why: str) -> None:
        super().__init__(f"cannot reach the podnet master at {server}: {why}")
        self.server = server
        self.why = why


class Unreachable(TransportError):
    """Connection refused, reset or dropped, or no answer in time: retry with backoff."""

    transient = True


class TLSFailure(TransportError):
    """The TLS handshake failed (certificate not trusted, wrong host): retrying won't help."""


class StatusError(ClientError):
    """The API answered with an error ``Status`` (or a non-2xx code without one)."""

    def __init__(
        self, message: str, code: int, reason: str, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message, code, reason)
        self.details = dict(details or {})

    def __str__(self) -> str:
        return f"from server ({self.reason}): {self.message}"


class ServerError(StatusError):
    """5xx or 429: the server is overloaded or briefly unavailable; retry with backoff."""

    transient = True


class InvalidResponse(ServerError):
    """The server's answer could not be read (not JSON, not an object)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message, code, "InvalidResponse")


class Expired(StatusError):
    """410: the resourceVersion asked for is older than the server keeps; list again."""


class NotFound(StatusError):
    """404: no such object (or collection)."""


class AlreadyExists(StatusError):
    """409 AlreadyExists: a create found an object of that name."""


class Conflict(StatusError):
    """409 Conflict: the object changed since the resourceVersion the write was based on."""


_BY_REASON: dict[str, type[StatusError]] = {
    "NotFound": NotFound,
    "AlreadyExists": AlreadyExists,
    "Conflict": Conflict,
    "Expired": Expired,
    "Gone": Expired,
}


def error_from_status(
    message: str, code: int, reason: str = "", details: Mapping[str, Any] | None = None
) -> StatusError:
    """The error for a Status ``message`` (empty: the reason), HTTP ``code`` and
    ``reason`` (empty: the code's).

    The in-process object API calls it with the fields of a ``podnet.model.errors.ApiError``
    so that callers see one tree whichever way they reach the API.
    """
    reason = reason or REASONS.get(code, "Unknown")
    message = message or reason
    if code >= 500 or code == 429:
        return ServerError(message, code, reason, details)
    cls = _BY_REASON.get(reason) or (Expired if code == 410 else StatusError)
    return cls(message, code, reason, details)


def error_from_status_object(status: Mapping[str, Any], fallback_code: int = 500) -> StatusError:
    """The error a ``Status`` object describes (an error answer's body, a watch ERROR)."""
    code = int(status.get("code") or fallback_code)
    return error_from_status(
        str(status.get("message") or ""),
        code,
        str(status.get("reason") or ""),
        status.get("details"),
    )


def error_from_body(code: int, body: bytes | str, phrase: str = "") -> StatusError:
    """The error for a non-2xx answer, read from its ``Status`` body when there is one."""
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("kind") == "Status":
        return error_from_status_object(status, code)
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    return error_from_status(" ".join(text.split())[:200] or phrase, code)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying with backoff: a transient ``ClientError``, or a
    timeout or connection error raised below the client."""
    if isinstance(exc, ClientError):
        return exc.transient
    return isinstance(exc, TimeoutError | ConnectionError)


def has_reason(exc: BaseException, *reasons: str) -> bool:
    """Whether ``exc`` is an API error with one of ``reasons`` (``NotFound``, ``Conflict``)."""
    return isinstance(exc, ClientError) and exc.reason in reasons


def caused_by(exc: BaseException, cause: type[BaseException]) -> bool:
    """Whether ``exc`` or an exception in its chain of causes is a ``cause``."""
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None:
            return False
        if isinstance(seen, cause):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def one_line(exc: BaseException) -> str:
    """An exception as one line of text (its type name when it has no message)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
