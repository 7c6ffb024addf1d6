"""The one client package of podnet: how every part of podnet talks to the API.

- ``errors``: the one exception tree (transient vs permanent explicit), ``is_transient``,
  ``error_from_status`` for the in-process API.
- ``backoff``: the one backoff (jitter, deadline) and ``with_retry``.
- ``watch``: the watch vocabulary (``WatchEvent``, ``EventType``, ``LISTED`` for "relist
  after 410"), ``ResourceVersion`` and ``resource_version``; ``paths``: ``resource_path``.
- ``objectapi``: the ``ObjectApi`` protocol controllers and agent loops are written against.
- ``reflector``: list + watch over any ``ObjectApi``, as one endless event stream.
- ``sync``: the httpx client of the CLI; ``aio``: the asyncio client (an ``ObjectApi``
  over HTTPS) of the node agent and of controllers run as their own process. Both share
  ``wire`` (headers, parameters, bodies), ``tls`` and the error decoding below the
  transport. Import them from their modules: each pulls in its HTTP library.
- ``apply``: kubectl's last-applied annotation and three-way merge patch.
"""

from podnet.client.backoff import WATCH_BACKOFF, Attempts, Backoff, with_retry
from podnet.client.errors import (
    AlreadyExists,
    ClientConfigError,
    ClientError,
    Conflict,
    Expired,
    InvalidResponse,
    NotFound,
    ServerError,
    StatusError,
    TLSFailure,
    TransportError,
    UnknownKind,
    Unreachable,
    error_from_body,
    error_from_status,
    error_from_status_object,
    has_reason,
    is_transient,
)
from podnet.client.objectapi import Listing, ObjectApi
from podnet.client.paths import KindRef, object_key, resolve_kind, resource_path
from podnet.client.watch import (
    ADDED,
    BOOKMARK,
    DELETED,
    LISTED,
    MODIFIED,
    EventType,
    Obj,
    ResourceVersion,
    WatchEvent,
    bookmark,
    resource_version,
)

__all__ = [
    "ADDED",
    "BOOKMARK",
    "DELETED",
    "LISTED",
    "MODIFIED",
    "WATCH_BACKOFF",
    "AlreadyExists",
    "Attempts",
    "Backoff",
    "ClientConfigError",
    "ClientError",
    "Conflict",
    "EventType",
    "Expired",
    "InvalidResponse",
    "KindRef",
    "Listing",
    "NotFound",
    "Obj",
    "ObjectApi",
    "ResourceVersion",
    "ServerError",
    "StatusError",
    "TLSFailure",
    "TransportError",
    "UnknownKind",
    "Unreachable",
    "WatchEvent",
    "bookmark",
    "error_from_body",
    "error_from_status",
    "error_from_status_object",
    "has_reason",
    "is_transient",
    "object_key",
    "resolve_kind",
    "resource_path",
    "resource_version",
    "with_retry",
]
