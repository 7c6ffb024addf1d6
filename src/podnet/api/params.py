"""Query parameters of the resource verbs, each checked before anything is read or written.

kube-apiserver converts every known query parameter into typed options and answers 400
BadRequest when one does not parse (``limit=abc``) or breaks a rule (``limit=-1``,
``continue`` together with a ``resourceVersion``). podnet does the same here, in one pure
function over the raw query, so a handler never sees a value it has not been promised.
Unknown parameters are ignored, as kube ignores them.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podnet.model import errors

MAX_INT64 = 2**63 - 1
MAX_WATCH_SECONDS = 3600  # longer watches are cut here; clients re-watch from the last event
MAX_FIELD_MANAGER = 128
TRUE = ("1", "t", "T", "true", "TRUE", "True")
FALSE = ("0", "f", "F", "false", "FALSE", "False")
BOOL_PARAMS = ("watch", "allowWatchBookmarks", "pretty", "orphanDependents", "sendInitialEvents")
MATCHES = ("", "NotOlderThan", "Exact")
VALIDATIONS = ("", "Ignore", "Warn", "Strict")
PROPAGATION = ("Orphan", "Background", "Foreground")


@dataclass(frozen=True)
class ContinueToken:
    """Where a paginated list resumes: the revision of its first page and the last key."""

    revision: int
    start_after: str

    def encode(self) -> str:
        raw = json.dumps({"v": 1, "rv": self.revision, "start": self.start_after})
        return base64.urlsafe_b64encode(raw.encode()).decode()

    @staticmethod
    def decode(token: str) -> ContinueToken:
        """Parse a token this server issued; 400 for anything else."""
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
            revision, start = data["rv"], data["start"]
        except (ValueError, KeyError, TypeError, UnicodeError, binascii.Error) as exc:
            raise errors.bad_request(f"continue key is not valid: {_short(token)}") from exc
        if not isinstance(revision, int) or isinstance(revision, bool) or revision <= 0:
            raise errors.bad_request("continue key is not valid: bad revision")
        if not isinstance(start, str) or not start or "\x00" in start:
            raise errors.bad_request("continue key is not valid: bad start key")
        return ContinueToken(revision, start)


@dataclass(frozen=True)
class QueryParams:
    """Every query parameter a resource verb understands, typed and checked."""

    watch: bool = False
    allow_bookmarks: bool = False
    limit: int = 0  # 0: no limit
    continue_token: ContinueToken | None = None
    resource_version: int | None = None  # None: not given (latest)
    resource_version_match: str = ""
    timeout_seconds: int | None = None
    propagation_policy: str | None = None
    grace_period_seconds: int | None = None


NO_PARAMS = QueryParams()


def parse_query(query: Mapping[str, str]) -> QueryParams:
    """Typed parameters from a request's query string; 400 BadRequest for a bad value."""
    if not query:
        return NO_PARAMS  # what the checks below make of an empty query (most requests)
    for name in BOOL_PARAMS:
        parse_bool(query, name)
    _check_strings(query)
    _dry_run(query)
    rv_text = query.get("resourceVersion", "")
    params = QueryParams(
        watch=parse_bool(query, "watch"),
        allow_bookmarks=parse_bool(query, "allowWatchBookmarks"),
        limit=parse_int(query, "limit", 0) or 0,
        continue_token=_continue(query),
        resource_version=parse_int(query, "resourceVersion", 0) if rv_text else None,
        resource_version_match=query.get("resourceVersionMatch", ""),
        timeout_seconds=parse_int(query, "timeoutSeconds", 0),
        propagation_policy=query.get("propagationPolicy") or None,
        grace_period_seconds=parse_int(query, "gracePeriodSeconds", 0),
    )
    _check_combinations(params)
    if parse_bool(query, "sendInitialEvents"):
        raise errors.bad_request("sendInitialEvents is not supported: list, then watch")
    return params


def parse_bool(query: Mapping[str, str], name: str) -> bool:
    """A boolean as Go's strconv.ParseBool reads it; empty means false."""
    value = query.get(name, "")
    if value in TRUE:
        return True
    if value in FALSE or value == "":
        return False
    raise errors.bad_request(f"{name}: invalid value {_short(value)}: must be true or false")


def parse_int(query: Mapping[str, str], name: str, minimum: int) -> int | None:
    """A decimal int64 of at least ``minimum``, or None when absent or empty."""
    value = query.get(name, "")
    if value == "":
        return None
    if not (value.isascii() and value.lstrip("-").isdigit()) or len(value) > 20:
        raise errors.bad_request(f"{name}: invalid value {_short(value)}: must be an integer")
    number = int(value)
    if number < minimum or number > MAX_INT64:
        raise errors.bad_request(
            f"{name}: invalid value {number}: must be between {minimum} and {MAX_INT64}"
        )
    return number


def _continue(query: Mapping[str, str]) -> ContinueToken | None:
    token = query.get("continue", "")
    return ContinueToken.decode(token) if token else None


def _dry_run(query: Mapping[str, str]) -> None:
    value = query.get("dryRun", "")
    if value == "":
        return
    if value != "All":
        raise errors.bad_request(f'dryRun: unsupported value {_short(value)}: supported: "All"')
    # Refused rather than half-done: a dry run that stored the object would be worse.
    raise errors.bad_request("dryRun is not supported by this server")


def _check_strings(query: Mapping[str, str]) -> None:
    """Enumerations and free-text parameters with kube's rules."""
    _one_of(query, "resourceVersionMatch", MATCHES)
    _one_of(query, "fieldValidation", VALIDATIONS)
    if query.get("propagationPolicy", ""):
        _one_of(query, "propagationPolicy", PROPAGATION)
    manager = query.get("fieldManager", "")
    if len(manager) > MAX_FIELD_MANAGER or not manager.isprintable():
        raise errors.bad_request(
            f"fieldManager: invalid value {_short(manager)}: must be at most "
            f"{MAX_FIELD_MANAGER} printable characters"
        )
    for name in ("labelSelector", "fieldSelector"):
        if "\x00" in query.get(name, ""):
            raise errors.bad_request(f"{name}: must not contain NUL")


def _one_of(query: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> None:
    value = query.get(name, "")
    if value not in allowed:
        shown = ", ".join(repr(a) for a in allowed if a)
        raise errors.bad_request(f"{name}: unsupported value {_short(value)}: supported: {shown}")


def _check_combinations(p: QueryParams) -> None:
    """The cross-parameter rules kube-apiserver's list options validation applies."""
    if p.continue_token is not None and p.resource_version not in (None, 0):
        raise errors.bad_request("specifying resource version is not allowed when using continue")
    if p.resource_version_match and p.resource_version is None:
        raise errors.bad_request(
            "resourceVersionMatch is forbidden unless resourceVersion is provided"
        )
    if p.resource_version_match == "Exact" and p.resource_version == 0:
        raise errors.bad_request(
            'resourceVersionMatch "Exact" is forbidden for resourceVersion "0"'
        )
    if p.continue_token is not None and p.resource_version_match:
        raise errors.bad_request("resourceVersionMatch is forbidden when continue is provided")
    if p.watch and p.resource_version_match:
        raise errors.bad_request("resourceVersionMatch is forbidden for watch")


def watch_timeout(params: QueryParams) -> float:
    """How long a watch may stay open: the caller's timeoutSeconds, capped."""
    if params.timeout_seconds is None or params.timeout_seconds == 0:
        return float(MAX_WATCH_SECONDS / 2)
    return float(min(params.timeout_seconds, MAX_WATCH_SECONDS))


def _short(value: str) -> str:
    return repr(value if len(value) <= 64 else value[:61] + "...")


@dataclass(frozen=True)
class DeleteOptions:
    """The parts of a DELETE body podnet acts on: its preconditions and a Pod's grace
    period (``gracePeriodSeconds``, body or query; see ``podnet.api.poddeletion``)."""

    resource_version: str | None = None
    uid: str | None = None
    grace_period_seconds: int | None = None


def parse_delete_options(body: Any) -> DeleteOptions:
    """A ``DeleteOptions`` body, checked field by field; 400 for a wrong shape or value."""
    if not isinstance(body, dict):
        raise errors.bad_request("DeleteOptions must be a JSON object")
    if body.get("kind") not in (None, "DeleteOptions"):
        raise errors.bad_request(f"the body is a {body.get('kind')!s}, not DeleteOptions")
    pre = body.get("preconditions")
    if pre is None:
        pre = {}
    if not isinstance(pre, dict):
        raise errors.bad_request("DeleteOptions.preconditions must be an object")
    for field in ("resourceVersion", "uid"):
        if pre.get(field) is not None and not isinstance(pre[field], str):
            raise errors.bad_request(f"DeleteOptions.preconditions.{field} must be a string")
    _check_delete_fields(body)
    grace = body.get("gracePeriodSeconds")
    return DeleteOptions(pre.get("resourceVersion") or None, pre.get("uid") or None, grace)


def _check_delete_fields(body: dict[str, Any]) -> None:
    policy = body.get("propagationPolicy")
    if policy is not None and policy not in PROPAGATION:
        raise errors.bad_request(
            f"DeleteOptions.propagationPolicy: unsupported value {policy!r}: "
            f"supported: {', '.join(PROPAGATION)}"
        )
    grace = body.get("gracePeriodSeconds")
    if grace is not None and (type(grace) is not int or not 0 <= grace <= MAX_INT64):
        raise errors.bad_request("DeleteOptions.gracePeriodSeconds must be a non-negative integer")
    orphan = body.get("orphanDependents")
    if orphan is not None and not isinstance(orphan, bool):
        raise errors.bad_request("DeleteOptions.orphanDependents must be true or false")
    dry_run = body.get("dryRun")
    if dry_run is not None and (not isinstance(dry_run, list) or dry_run):
        raise errors.bad_request("DeleteOptions.dryRun is not supported by this server")
