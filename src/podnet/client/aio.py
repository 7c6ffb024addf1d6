"""The asyncio client of the podnet API (aiohttp): an ``ObjectApi`` over HTTPS with a
bearer token, for the node agent and for controllers run as their own process.

Besides the ``ObjectApi`` calls it has what the agent needs: ``get_or_none``, merge
``patch`` and writes to a subresource (``status``). Failures are the
``podnet.client.errors`` tree: ``Unreachable`` (transient) when no answer came,
``TLSFailure`` when the handshake failed, a ``StatusError`` for an error answer.
Long-lived streams go through ``podnet.client.reflector.reflect(client, kind)``.

``reload`` swaps the credentials without a restart (a rotated client certificate,
``podnet.agent.certrotation``): new requests go over new connections that present the
new certificate; the old connections are closed once their requests had the time to
finish, which also ends the watches on them (their reflectors watch again, as after any
broken watch, on the new connections), as kubelet closes its connections on rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

import aiohttp

from podnet.client.errors import (
    NotFound,
    TLSFailure,
    TransportError,
    Unreachable,
    error_from_body,
    one_line,
)
from podnet.client.objectapi import Listing
from podnet.client.paths import metadata, resource_path
from podnet.client.tls import ssl_context
from podnet.client.watch import Obj, ResourceVersion, WatchEvent, decode_event, resource_version
from podnet.client.wire import MERGE_PATCH, Call, headers, json_object, selectors, watch_params
from podnet.kubeconfig import ClientConfig
from podnet.model.kinds import Kind

REQUEST_TIMEOUT = 10.0  # seconds, one whole request
CONNECT_TIMEOUT = 10.0
WATCH_SECONDS = (300, 600)  # the server ends each watch after a random time in this range
WATCH_READ_TIMEOUT = 60.0  # the server sends a bookmark every 10 s, so silence means dead


class AsyncApiClient:
    """Talks to the podnet master with the kubeconfig's token and CA."""

    def __init__(
        self, config: ClientConfig, timeout: float = REQUEST_TIMEOUT, agent: str = "podnet-node"
    ) -> None:
        self.config = config
        self.timeout = timeout
        self.agent = agent
        self._session: aiohttp.ClientSession | None = None
        self._retiring: set[asyncio.Task[None]] = set()  # old sessions closing (reload)

    def session(self) -> aiohttp.ClientSession:
        """The shared session (made on first use, inside the running loop)."""
        if self._session is None or self._session.closed:
            tls = ssl_context(self.config) if self.config.server.startswith("https:") else False
            self._session = aiohttp.ClientSession(
                base_url=self.config.server,
                headers=headers(self.config, self.agent),
                connector=aiohttp.TCPConnector(ssl=tls, limit=32),
                read_bufsize=2**20,
                timeout=aiohttp.ClientTimeout(total=self.timeout, sock_connect=CONNECT_TIMEOUT),
            )
        return self._session

    async def close(self) -> None:
        """Close the connections (those ``reload`` retired too)."""
        for task in list(self._retiring):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    def reload(self, config: ClientConfig) -> None:
        """Use ``config`` (same server, new credentials) for every request from now on.
        Its TLS material is checked first (``ClientConfigError``, and nothing changes);
        the old session is closed after ``timeout`` seconds."""
        if config.server.startswith("https:"):
            ssl_context(config)
        self.config = config
        old, self._session = self._session, None
        if old is not None and not old.closed:
            task = asyncio.create_task(self._retire(old), name="retire-api-session")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, old: aiohttp.ClientSession) -> None:
        try:
            await asyncio.sleep(self.timeout)
        finally:
            await old.close()

    async def request(self, call: Call) -> Obj:
        """One API call; returns the decoded JSON answer or raises a ``ClientError``."""
        session = self.session()
        try:
            async with session.request(
                call.method,
                call.path,
                data=call.content(),
                params=call.params,
                headers=call.headers(),
            ) as resp:
                payload = await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise self._unreachable(str(call), exc) from exc
        if not 200 <= resp.status < 300:
            raise error_from_body(resp.status, payload, resp.reason or "")
        return json_object(payload, resp.status, str(call))

    # ---- ObjectApi -----------------------------------------------------------------------

    async def list(
        self, kind: Kind, namespace: str | None = None, field_selector: str = ""
    ) -> Listing:
        """Every object of ``kind`` and the list's resourceVersion."""
        params = {"fieldSelector": field_selector} if field_selector else None
        answer = await self.request(Call("GET", resource_path(kind, namespace), params=params))
        return Listing(list(answer.get("items") or []), resource_version(answer))

    async def watch(
        self,
        kind: Kind,
        since: ResourceVersion,
        namespace: str | None = None,
        field_selector: str = "",
    ) -> AsyncIterator[WatchEvent]:
        """The changes after ``since`` until the server ends the watch (bookmarks too)."""
        params = watch_params(since, random.randint(*WATCH_SECONDS), bookmarks=True)
        params.update(selectors(field_selector=field_selector))
        timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT, sock_read=WATCH_READ_TIMEOUT)
        path = resource_path(kind, namespace)
        try:
            async with self.session().get(path, params=params, timeout=timeout) as resp:
                if resp.status != 200:
                    raise error_from_body(resp.status, await resp.read(), resp.reason or "")
                async for line in resp.content:
                    if line.strip():
                        yield decode_event(line)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise self._unreachable(f"watch {kind.plural}", exc) from exc

    async def get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        """Read one object."""
        return await self.request(Call("GET", resource_path(kind, namespace, name)))

    async def create(self, kind: Kind, obj: Obj, namespace: str | None = None) -> Obj:
        """Create an object (the namespace defaults to the object's own)."""
        ns = namespace or metadata(obj).get("namespace")
        return await self.request(Call("POST", resource_path(kind, ns), obj))

    async def update(self, kind: Kind, obj: Obj, *, subresource: str = "") -> Obj:
        """Replace an object (PUT) or its ``subresource``; a stale ``resourceVersion``
        raises ``Conflict``."""
        meta = metadata(obj)
        path = resource_path(kind, meta.get("namespace"), meta["name"], subresource)
        return await self.request(Call("PUT", path, obj))

    async def delete(
        self, kind: Kind, namespace: str | None, name: str, *, resource_version: int | None = None
    ) -> None:
        """Delete one object, only at ``resource_version`` when given."""
        options = None
        if resource_version is not None:
            options = {"preconditions": {"resourceVersion": str(resource_version)}}
        await self.request(Call("DELETE", resource_path(kind, namespace, name), options))

    # ---- what the agent adds -------------------------------------------------------------

    async def get_or_none(self, kind: Kind, namespace: str | None, name: str) -> Obj | None:
        """Read one object, or None when it does not exist."""
        try:
            return await self.get(kind, namespace, name)
        except NotFound:
            return None

    async def update_status(self, kind: Kind, obj: Obj) -> Obj:
        """Replace the object's status through the ``status`` subresource."""
        return await self.update(kind, obj, subresource="status")

    async def patch(
        self, kind: Kind, namespace: str | None, name: str, patch: Obj, *, subresource: str = ""
    ) -> Obj:
        """Apply a JSON merge patch (RFC 7386) to an object or its subresource."""
        path = resource_path(kind, namespace, name, subresource)
        return await self.request(Call("PATCH", path, patch, content_type=MERGE_PATCH))

    def _unreachable(self, what: str, exc: BaseException) -> TransportError:
        if isinstance(exc, aiohttp.ClientSSLError):
            return TLSFailure(self.config.server, f"{what}: {one_line(exc)}")
        return Unreachable(self.config.server, f"{what}: {one_line(exc)}")
