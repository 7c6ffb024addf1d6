"""The master's audit log: one JSON line per write request, once its response code is known.

A write is any POST, PUT, PATCH or DELETE, answered or refused (401, 403, 404, 409...):
who (``user.username``, ``user.groups``; null when the request did not authenticate),
what (``verb``: create, update, patch, delete, deletecollection; ``objectRef``: resource,
namespace, name, subresource, apiGroup, apiVersion) and ``responseStatus.code``, with
``time`` (RFC 3339 UTC), ``requestURI``, ``sourceIPs`` and ``userAgent``; the field names
are those of Kubernetes' audit events, so the same ``jq`` filters work. Reads are not
logged. A create's name is the created object's (a ``generateName`` one included).

Lines cannot be forged: each is ``json.dumps`` with ``ensure_ascii`` (no raw control or
non-ASCII character, so no newline, carriage return or ANSI escape from a name, path or
user agent reaches the file as itself), and every string is cut at ``MAX_FIELD``
characters. The file is made 0600 (as are its rotated copies) and rotates at
``max_bytes`` keeping ``backups`` old files (``logging.handlers.RotatingFileHandler``).
"""

from __future__ import annotations

import io
import logging
import os
import time
from dataclasses import dataclass
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from podnet.api.handlers import RESOURCE, USER, VERB
from podnet.api.requests import resolve
from podnet.logsetup import rfc3339, to_json_line
from podnet.model import errors
from podnet.ratelog import RateLimitedLog

log = logging.getLogger(__name__)
MIB = 1024 * 1024
WRITE_METHODS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
MAX_FIELD = 512  # characters of one string field (names are at most 253)


@dataclass(frozen=True)
class AuditOptions:
    """``podnet master --audit-log ...``: on by default, in the state directory."""

    enabled: bool = True
    path: Path | None = None  # None: <state dir>/audit.log
    max_bytes: int = 100 * MIB  # rotate at this size
    backups: int = 5  # rotated files kept: audit.log.1 ... audit.log.<backups>


class _PrivateRotatingFile(RotatingFileHandler):
    """A rotating file opened 0600 (never through a symbolic link), rotated copies too."""

    def _open(self) -> io.TextIOWrapper:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(self.baseFilename, flags, 0o600)
        os.fchmod(fd, 0o600)  # an existing file made by someone else's umask
        return open(fd, "a", encoding="utf-8")  # the handler closes it

    def write_line(self, line: str) -> None:
        """``line`` and a newline (ASCII: a character is a byte), after a rollover when
        they would take a file that holds something past ``maxBytes``: the handler's
        rotation without a ``LogRecord`` and two ``stat`` calls a line."""
        data = line + "\n"
        with self.lock:  # type: ignore[union-attr]  # made by Handler.__init__
            if self.stream is None:
                self.stream = self._open()
            end = self.stream.seek(0, os.SEEK_END)
            if end and end + len(data) > self.maxBytes:
                self.doRollover()
            self.stream.write(data)
            self.stream.flush()


class AuditLog:
    """Writes the audit lines of one API server."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        if max_bytes < 1 or backups < 1:
            raise ValueError("the audit log needs a size bound and at least one backup")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = path
        self._file = _PrivateRotatingFile(path, maxBytes=max_bytes, backupCount=backups)
        self._failures = RateLimitedLog(log, every=60.0)

    @classmethod
    def from_options(cls, options: AuditOptions, state_dir: Path) -> AuditLog | None:
        if not options.enabled:
            return None
        path = options.path or state_dir / "audit.log"
        return cls(path, options.max_bytes, options.backups)

    def record(self, request: web.Request, code: int, response: web.StreamResponse | None) -> None:
        """Log ``request`` if it is a write, answered with ``code``."""
        if request.method not in WRITE_METHODS:
            return
        try:
            self._file.write_line(to_json_line(event(request, code, response)))
        except Exception as exc:  # never the request's failure; said on stderr, bounded
            self._failures.warning(type(exc).__name__, "audit line lost: %r", exc)

    def close(self) -> None:
        self._file.close()


def event(request: web.Request, code: int, response: web.StreamResponse | None) -> dict[str, Any]:
    """The audit event of a write request answered with ``code``."""
    user = request.get(USER)
    verb = request.get(VERB, "")
    ref = _object_ref(request)
    if verb not in WRITE_VERBS:  # refused before the handler named it
        verb = WRITE_METHODS[request.method]
        if verb == "delete" and ref.get("apiVersion") and not ref.get("name"):
            verb = "deletecollection"
    if verb == "create" and 200 <= code < 300 and not ref.get("name"):
        ref["name"] = _created_name(response)
    return {
        "time": rfc3339(time.time()),
        "verb": verb,
        "user": None if user is None else {"username": user.name, "groups": list(user.groups)},
        "objectRef": {k: _cut(v) for k, v in ref.items() if v},
        "responseStatus": {"code": code},
        "requestURI": _cut(request.raw_path),
        "sourceIPs": [request.remote or ""],
        "userAgent": _cut(request.headers.get("User-Agent", "")),
    }


def _object_ref(request: web.Request) -> dict[str, Any]:
    ref: dict[str, Any] = {"resource": request.get(RESOURCE, "")}
    route = _resource_path(request)
    if route is None:
        return ref
    group, version, tail = route
    ref.update(apiGroup=group, apiVersion=version)
    try:
        target = resolve(group, version, tail)
    except errors.ApiError:  # no such resource: the URI says what was tried
        return ref
    ref.update(
        resource=target.kind.plural,
        namespace=target.namespace,
        name=target.name,
        subresource=target.subresource,
    )
    return ref


def _resource_path(request: web.Request) -> tuple[str, str, str] | None:
    """(group, version, the rest) of a resource path: the route's, or the path's own when
    no route matched it (a name holding a newline matches none)."""
    info = request.match_info
    if "tail" in info:
        return info.get("group", ""), info.get("version", ""), info["tail"]
    path = request.path
    if path.startswith("/api/"):
        group, rest = "", path[len("/api/") :]
    elif path.startswith("/apis/"):
        group, _, rest = path[len("/apis/") :].partition("/")
    else:
        return None
    version, _, tail = rest.partition("/")
    return (group, version, tail) if tail else None


def _created_name(response: web.StreamResponse | None) -> str | None:
    """The name of the object a successful create answered with, if it is JSON."""
    body = getattr(response, "body", None)
    if not isinstance(body, bytes) or not body.startswith(b"{"):
        return None
    try:
        meta = orjson.loads(body).get("metadata") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def _cut(value: str) -> str:
    """``value`` cut at ``MAX_FIELD`` characters (a client's strings: path, name, agent)."""
    return value if len(value) <= MAX_FIELD else value[:MAX_FIELD] + "...(truncated)"
