"""The node agent's asynchronous API client (aiohttp): CRUD, merge patch, list and watch.

Errors form one tree, documented here:

- ``ApiClientError``: every failure of this client.
  - ``TransientApiError``: worth retrying with backoff: no connection, timeout, the
    connection dropped, HTTP 5xx or 429.
  - ``PermanentApiError``: the request itself is wrong or refused (other 4xx, TLS
    verification failure): surface it, do not retry. ``code`` and ``reason`` are the
    API ``Status``'s (``NotFound``, ``AlreadyExists``, ``Conflict``...).

``with_retry`` runs a call until it succeeds, retrying transient errors with jittered
exponential backoff until a deadline. ``AsyncApiClient.watch`` merges a listing and a
watch into one endless stream: a ``LISTED`` event with every object, then ``ADDED``,
``MODIFIED`` and ``DELETED``; when the watch expires (HTTP 410 or an ``ERROR`` event with
code 410) it lists again and emits a fresh ``LISTED``; on connection errors it resumes
from the last resourceVersion after a jittered backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from podnet.kubeconfig import ClientConfig
from podnet.model.kinds import Kind

log = logging.getLogger("podnet.agent.api")

Obj = dict[str, Any]
T = TypeVar("T")

LISTED, ADDED, MODIFIED, DELETED = "LISTED", "ADDED", "MODIFIED", "DELETED"
REQUEST_TIMEOUT = 10.0  # seconds, one whole request
CONNECT_TIMEOUT = 10.0
WATCH_SECONDS = (300, 600)  # the server ends each watch after a random time in this range
WATCH_READ_TIMEOUT = 60.0  # the server sends a bookmark every 10 s, so silence means dead
MERGE_PATCH = "application/merge-patch+json"


class ApiClientError(Exception):
    """A failed API call; ``code`` is the HTTP status (0 when there was no answer)."""

    def __init__(self, message: str, code: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class TransientApiError(ApiClientError):
    """No answer, or a 5xx/429: retry with backoff."""


class PermanentApiError(ApiClientError):
    """A 4xx (or TLS) refusal: retrying the same request will not help."""


class WatchExpired(TransientApiError):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying."""
    return isinstance(exc, TransientApiError)


def has_reason(exc: BaseException, *reasons: str) -> bool:
    """Whether ``exc`` is an API error with one of ``reasons`` (``NotFound``, ``Conflict``)."""
    return isinstance(exc, ApiClientError) and exc.reason in reasons


def error_from_answer(code: int, body: bytes) -> ApiClientError:
    """The error for a non-2xx answer, read from its ``Status`` body when there is one."""
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if not isinstance(status, dict):
        status = {}
    reason = str(status.get("reason") or "")
    message = str(status.get("message") or body[:200].decode("utf-8", "replace") or code)
    if code == 410:
        return WatchExpired(message, code, reason or "Expired")
    if code >= 500 or code == 429:
        return TransientApiError(message, code, reason)
    return PermanentApiError(message, code, reason)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: ``initial * factor**attempt``, capped, times a
    random factor from ``floor`` to 1 (``floor=0`` is "full jitter")."""

    initial: float = 0.1
    cap: float = 10.0
    factor: float = 2.0
    floor: float = 0.5

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        base = min(self.cap, self.initial * self.factor ** min(attempt, 32))
        return base * random.uniform(self.floor, 1.0)


# Watches (and their listings) retry at least once a second, with full jitter so that
# the agents of a cluster do not reconnect in step: a watch is back within ~1 s of the
# master, and each agent costs a down master at most a few refused connections a second.
WATCH_BACKOFF = Backoff(0.2, 1.0, floor=0.0)


async def with_retry(
    call: Callable[[], Awaitable[T]],
    what: str,
    deadline: float | None = 60.0,
    backoff: Backoff = Backoff(),
    retry_if: Callable[[BaseException], bool] = is_transient,
) -> T:
    """Run ``call``; retry failures ``retry_if`` accepts until ``deadline`` seconds
    (None: for ever). The last error is raised when the deadline would pass."""
    loop = asyncio.get_running_loop()
    give_up = None if deadline is None else loop.time() + deadline
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            delay = backoff.delay(attempt)
            if not retry_if(exc) or (give_up is not None and loop.time() + delay > give_up):
                raise
            level = logging.WARNING if attempt % 10 == 0 else logging.DEBUG
            log.log(level, "%s failed (%s); retrying in %.2fs", what, exc, delay)
            await asyncio.sleep(delay)
            attempt += 1


@dataclass(frozen=True)
class WatchEvent:
    """One item of ``watch``: ``object`` for changes, ``items`` for ``LISTED``."""

    type: str
    object: Obj | None = None
    items: tuple[Obj, ...] = ()


def resource_version(obj: Mapping[str, Any]) -> str:
    """The object's ``metadata.resourceVersion`` ("" when absent)."""
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _ssl_context(config: ClientConfig) -> ssl.SSLContext | bool:
    if not config.server.startswith("https://"):
        return False
    if config.insecure_skip_tls_verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    cadata = config.ca_data.decode() if config.ca_data else None
    return ssl.create_default_context(cadata=cadata)


def resource_path(
    kind: Kind, name: str | None = None, namespace: str | None = None, subresource: str = ""
) -> str:
    """The URL path of a collection, an object or an object's subresource."""
    path = kind.base_path()
    if kind.namespaced and namespace:
        path += f"/namespaces/{namespace}"
    path += f"/{kind.plural}"
    if name:
        path += f"/{name}"
    return f"{path}/{subresource}" if subresource else path


class AsyncApiClient:
    """Talks to the podnet master as one node (bearer token, CA from the kubeconfig)."""

    def __init__(self, config: ClientConfig, timeout: float = REQUEST_TIMEOUT) -> None:
        self.config = config
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        """The shared session (made on first use, inside the running loop)."""
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json", "User-Agent": "podnet-node"}
            if self.config.token:
                headers["Authorization"] = f"Bearer {self.config.token}"
            connector = aiohttp.TCPConnector(ssl=_ssl_context(self.config), limit=32)
            self._session = aiohttp.ClientSession(
                base_url=self.config.server,
                headers=headers,
                connector=connector,
                read_bufsize=2**20,
                timeout=aiohttp.ClientTimeout(total=self.timeout, sock_connect=CONNECT_TIMEOUT),
            )
        return self._session

    async def close(self) -> None:
        """Close the connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One API call; returns the decoded JSON answer or raises an ``ApiClientError``."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if data is not None else None
        try:
            async with self.session().request(
                method, path, data=data, params=params, headers=headers
            ) as resp:
                payload = await resp.read()
        except aiohttp.ClientSSLError as exc:
            raise PermanentApiError(f"{method} {path}: TLS failure: {exc}") from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise TransientApiError(f"{method} {path}: {exc or type(exc).__name__}") from exc
        if not 200 <= resp.status < 300:
            raise error_from_answer(resp.status, payload)
        return _decode(payload, method, path)

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        """Read one object."""
        return await self.request("GET", resource_path(kind, name, namespace))

    async def get_or_none(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        """Read one object, or None when it does not exist."""
        try:
            return await self.get(kind, name, namespace)
        except PermanentApiError as exc:
            if exc.code == 404:
                return None
            raise

    async def list(
        self, kind: Kind, namespace: str | None = None, field_selector: str = ""
    ) -> tuple[list[Obj], str]:
        """Every object of ``kind`` and the list's resourceVersion."""
        params = {"fieldSelector": field_selector} if field_selector else None
        answer = await self.request("GET", resource_path(kind, None, namespace), params=params)
        return list(answer.get("items") or []), resource_version(answer)

    async def create(self, kind: Kind, obj: Obj, namespace: str | None = None) -> Obj:
        """Create an object (201); ``AlreadyExists`` is a ``PermanentApiError``."""
        return await self.request("POST", resource_path(kind, None, namespace), obj)

    async def update(
        self, kind: Kind, obj: Obj, namespace: str | None = None, subresource: str = ""
    ) -> Obj:
        """Replace an object (PUT); a stale ``resourceVersion`` raises ``Conflict``."""
        name = obj["metadata"]["name"]
        return await self.request("PUT", resource_path(kind, name, namespace, subresource), obj)

    async def update_status(self, kind: Kind, obj: Obj, namespace: str | None = None) -> Obj:
        """Replace the object's status through the ``status`` subresource."""
        return await self.update(kind, obj, namespace, "status")

    async def patch(
        self,
        kind: Kind,
        name: str,
        patch: Obj,
        namespace: str | None = None,
        subresource: str = "",
    ) -> Obj:
        """Apply a JSON merge patch (RFC 7386) to an object or its subresource."""
        path = resource_path(kind, name, namespace, subresource)
        return await self.request("PATCH", path, patch, content_type=MERGE_PATCH)

    async def watch(
        self, kind: Kind, namespace: str | None = None, backoff: Backoff = WATCH_BACKOFF
    ) -> AsyncIterator[WatchEvent]:
        """``LISTED`` then changes, for ever; relists on expiry, reconnects on errors.

        Permanent errors of the listing (403, 404) are raised to the caller."""
        version = ""
        attempt = 0
        while True:
            if not version:
                items, version = await with_retry(
                    lambda: self.list(kind, namespace), f"list {kind.plural}", None, backoff
                )
                yield WatchEvent(LISTED, items=tuple(items))
            try:
                async for event in self._watch_once(kind, namespace, version):
                    attempt = 0
                    version = resource_version(event.object or {}) or version
                    if event.type != "BOOKMARK":
                        yield event
            except WatchExpired:
                log.info("watch of %s expired at %s; listing again", kind.plural, version)
                version = ""
            except TransientApiError as exc:
                delay = backoff.delay(attempt)
                attempt += 1
                log.warning("watch of %s failed (%s); again in %.1fs", kind.plural, exc, delay)
                await asyncio.sleep(delay)

    async def _watch_once(
        self, kind: Kind, namespace: str | None, version: str
    ) -> AsyncIterator[WatchEvent]:
        params = {
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(random.randint(*WATCH_SECONDS)),
        }
        timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT, sock_read=WATCH_READ_TIMEOUT)
        path = resource_path(kind, None, namespace)
        try:
            async with self.session().get(path, params=params, timeout=timeout) as resp:
                if resp.status != 200:
                    raise error_from_answer(resp.status, await resp.read())
                async for line in resp.content:
                    if line.strip():
                        yield _watch_event(line)
        except aiohttp.ClientSSLError as exc:
            raise PermanentApiError(f"watch {kind.plural}: TLS failure: {exc}") from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise TransientApiError(f"watch {kind.plural}: {exc or type(exc).__name__}") from exc


def _decode(payload: bytes, method: str, path: str) -> Obj:
    if not payload:
        return {}
    try:
        obj = json.loads(payload)
    except ValueError as exc:
        raise TransientApiError(f"{method} {path}: the answer is not JSON") from exc
    if not isinstance(obj, dict):
        raise TransientApiError(f"{method} {path}: the answer is not a JSON object")
    return obj


def _watch_event(line: bytes) -> WatchEvent:
    try:
        event = json.loads(line)
        kind, obj = event["type"], event["object"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TransientApiError(f"unreadable watch event: {line[:120]!r}") from exc
    if kind == "ERROR":
        code = int(obj.get("code") or 500) if isinstance(obj, dict) else 500
        raise error_from_answer(code, json.dumps(obj).encode())
    return WatchEvent(kind, obj)
