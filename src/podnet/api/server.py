"""The HTTPS API server: middleware, non-resource endpoints and the resource routes."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from asyncio import sslproto
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web
from prometheus_client import Counter, Histogram

from podnet import __version__
from podnet.api import (
    access_review,
    clusterinfo,
    controlplanecerts,
    discovery,
    egressnotice,
    openapi,
)
from podnet.api.audit import AuditLog
from podnet.api.auth import User
from podnet.api.authorizer import AUTHORIZATION_GROUP, allowed_by_rules, require_path
from podnet.api.certauth import Revoked, nothing_revoked, user_of_certificate
from podnet.api.handlers import NOTICE, RESOURCE, USER, VERB, ResourceHandlers, json_response
from podnet.api.limits import RequestLimits
from podnet.api.metrics import ApiMetrics
from podnet.api.registry import Registry
from podnet.api.requests import MAX_BODY, read_body
from podnet.api.watchcache import WatchCache
from podnet.listener import ConnectionLimits, Listener, listening_socket
from podnet.model import errors
from podnet.store.base import StoreUnavailable

log = logging.getLogger(__name__)

# asyncio's TLS transport keeps a read buffer of SSLProtocol.max_size (256 KiB) per
# connection, for the socket's bytes on their way into OpenSSL: 3.8 GB for 15,000
# connections. A watch connection reads one request and then nothing; a large body is
# read in more, smaller pieces. 4 KiB: 60 MB for 15,000.
SSL_READ_BUFFER = 4 * 1024
PUBLIC_PATHS = frozenset(
    {"/healthz", "/readyz", "/leaderz", "/livez", "/version", clusterinfo.PATH}
)
ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Why the server is not ready yet, or None when it is (besides etcd, which /readyz checks).
Readiness = Callable[[], Awaitable[str | None]]


def _require_review(user: User, resource: str) -> None:
    """403 unless a rule lets ``user`` ask what it may do (everyone authenticated but a
    bootstrap token, which may do nothing yet)."""
    if not allowed_by_rules(user, "create", AUTHORIZATION_GROUP, resource, None, None):
        reason = f'User "{user.name}" cannot create {resource}.{AUTHORIZATION_GROUP}'
        raise errors.forbidden(f"{resource}.{AUTHORIZATION_GROUP} is forbidden: {reason}")


class Authenticator(Protocol):
    """Who presents an ``Authorization`` header (``podnet.api.tokenauth``); 401 if nobody."""

    async def authenticate_request(self, authorization_header: str | None) -> User: ...


async def _always_ready() -> str | None:
    return None


class ApiServer:
    """Owns the aiohttp application and its listener."""

    def __init__(
        self,
        registry: Registry,
        tokens: Authenticator,
        metrics: ApiMetrics | None = None,
        ready: Readiness | None = None,
        limits: RequestLimits | None = None,
        connections: ConnectionLimits | None = None,
        leading: Callable[[], bool] = lambda: False,
        audit: AuditLog | None = None,
        revoked: Revoked = nothing_revoked,
        cluster_info: clusterinfo.ClusterInfo | None = None,
        control_plane_certs: controlplanecerts.ControlPlaneCerts | None = None,
    ) -> None:
        self.registry = registry
        self.tokens = tokens
        self.revoked = revoked  # client certificates' revocation (podnet.api.certauth)
        self.metrics = metrics or ApiMetrics()
        self.cache = WatchCache(registry, observe=self.metrics.watch_dispatch.observe)
        self.handlers = ResourceHandlers(registry, self.cache, self.metrics, limits)
        self.connections = connections or ConnectionLimits()
        self.listener: Listener | None = None
        self._ready = ready or _always_ready
        self._leading = leading
        self.audit = audit  # podnet.api.audit: a line per write, after its response
        self._runner: web.AppRunner | None = None
        self._metric_children: dict[tuple[str, str, int], tuple[Counter, Histogram | None]] = {}
        self.address = ""
        self.cluster_info = cluster_info  # GET /cluster-info, for joining hosts
        self.control_plane_certs = control_plane_certs  # GET /control-plane-certs
        self.notices = egressnotice.Notices(registry)  # stored but not enforced: said

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._errors],
            client_max_size=MAX_BODY + 1,
        )
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/livez", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/leaderz", self._leaderz)
        app.router.add_get("/version", self._version)
        if self.cluster_info is not None:
            app.router.add_get(clusterinfo.PATH, self.cluster_info.handle)
        if self.control_plane_certs is not None:
            app.router.add_get(controlplanecerts.PATH, self.control_plane_certs.handle)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/openapi/v3", self._openapi_root)
        app.router.add_get("/openapi/v3/{path:.+}", self._openapi_group_version)
        app.router.add_get("/api", self._api)
        app.router.add_get("/apis", self._apis)
        app.router.add_get("/api/{version}", self._core_resources)
        app.router.add_get("/apis/{group}", self._group)
        app.router.add_get("/apis/{group}/{version}", self._group_resources)
        reviews = f"/apis/{access_review.API_VERSION}"
        app.router.add_post(f"{reviews}/selfsubjectaccessreviews", self._access_review)
        app.router.add_post(f"{reviews}/selfsubjectrulesreviews", self._rules_review)
        app.router.add_route("*", "/api/{version}/{tail:.+}", self.handlers.core)
        app.router.add_route("*", "/apis/{group}/{version}/{tail:.+}", self.handlers.grouped)
        return app

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> None:
        sslproto.SSLProtocol.max_size = min(sslproto.SSLProtocol.max_size, SSL_READ_BUFFER)
        await self.cache.start()
        self.handlers.admission.sweeper.start()
        limits = self.connections
        self._runner = web.AppRunner(
            self.app(),
            access_log=None,
            handler_cancellation=True,
            keepalive_timeout=limits.idle_timeout,  # from the connection's start, too
        )
        await self._runner.setup()
        assert self._runner.server is not None
        sock = listening_socket(host, port)
        serve = connection_server(self._runner.server, ssl_context, limits.handshake_timeout)
        self.listener = Listener(sock, serve, limits, "API server")
        self.listener.start()
        scheme = "https" if ssl_context else "http"
        self.address = f"{scheme}://{host}:{sock.getsockname()[1]}"
        log.info("API server listening on %s", self.address)

    async def stop(self) -> None:
        await self.handlers.admission.sweeper.stop()
        await self.cache.stop()
        if self._runner:
            await self._runner.cleanup()
        if self.listener:
            await self.listener.close()

    # ---- middleware -------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        code = 500
        response: web.StreamResponse | None = None  # the audit log reads a create's name
        try:
            # Authentication here rather than in a middleware of its own: one layer less.
            if request.path in PUBLIC_PATHS:
                request[USER] = ANONYMOUS
            else:
                request[USER] = await self._authenticate(request)
            require_path(request[USER], request.method, request.path)  # /metrics: roles.py
            response = await handler(request)
            code = response.status
            notice = request.get(NOTICE)
            if notice is not None and code < 300 and not response.prepared:
                self.notices.tell(response, *notice)
            return response
        except errors.ApiError as exc:
            code = exc.code
            response = json_response(exc.status(), exc.code)
            retry_after = getattr(exc, "retry_after", None)  # 429 from the event quota
            if retry_after is not None:
                response.headers["Retry-After"] = str(retry_after)
            return response
        except StoreUnavailable as exc:
            code = 503
            return json_response(errors.unavailable(f"storage unavailable: {exc}").status(), 503)
        except web.HTTPRequestEntityTooLarge:
            code = 413
            return json_response(errors.too_large("the request body is too large").status(), 413)
        except web.HTTPException as exc:
            code = exc.status
            err = errors.ApiError(exc.reason or "error", exc.status, exc.reason or "Unknown")
            return json_response(err.status(), exc.status)
        except Exception:
            log.exception("internal error serving %s %s", request.method, request.path)
            return json_response(errors.ApiError("internal error").status(), 500)
        finally:
            self._count(request, code, started)
            if self.audit is not None:
                self.audit.record(request, code, response)

    async def _authenticate(self, request: web.Request) -> User:
        """By the verified client certificate when there is one, else by bearer token."""
        der = _peer_certificate(request)
        if der is not None:
            return user_of_certificate(der, self.revoked)
        return await self.tokens.authenticate_request(request.headers.get("Authorization"))

    def _count(self, request: web.Request, code: int, started: float) -> None:
        verb = request.get(VERB, request.method.lower())
        key = (verb, request.get(RESOURCE, ""), code)
        children = self._metric_children.get(key)
        if children is None:  # prometheus' labels() validates and locks: once per key
            requests = self.metrics.requests.labels(key[0], key[1], str(code))
            latency = self.metrics.latency.labels(key[0], key[1]) if verb != "watch" else None
            children = self._metric_children[key] = (requests, latency)
        children[0].inc()
        if children[1] is not None:
            children[1].observe(time.perf_counter() - started)

    # ---- non-resource endpoints -------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, request: web.Request) -> web.Response:
        try:
            why = await self._ready()
            if why:
                return web.Response(text=f"not ready: {why}", status=503)
            await self.registry.store.revision()
        except Exception as exc:
            return web.Response(text=f"not ready: etcd: {exc}", status=503)
        return web.Response(text="ok")

    async def _leaderz(self, request: web.Request) -> web.Response:
        """200 while this master leads, its controllers through their first sync; 503 on
        a standby (which ``/readyz`` calls ready) and on a master without controllers."""
        if self._leading():
            return web.Response(text="leading")
        return web.Response(text="not leading", status=503)

    async def _version(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "major": "1",
                "minor": "32",
                "gitVersion": f"v1.32.0-podnet.{__version__}",
                "gitCommit": "",
                "gitTreeState": "clean",
                "buildDate": "",
                "goVersion": "python",
                "compiler": "cpython",
                "platform": "linux/amd64",
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain")

    async def _openapi_root(self, request: web.Request) -> web.Response:
        return json_response(openapi.root_document())

    async def _openapi_group_version(self, request: web.Request) -> web.Response:
        path = request.match_info["path"]
        group_version = path.removeprefix("apis/").removeprefix("api/")
        body = openapi.group_version_document(group_version)
        if body is None:
            raise errors.ApiError(
                "the server could not find the requested resource", 404, "NotFound"
            )
        return web.Response(body=body, content_type="application/json")

    async def _access_review(self, request: web.Request) -> web.Response:
        request[VERB], request[RESOURCE] = "create", "selfsubjectaccessreviews"
        _require_review(request[USER], "selfsubjectaccessreviews")
        body = await _review_body(request)
        return json_response(access_review.access_review(request[USER], body), 201)

    async def _rules_review(self, request: web.Request) -> web.Response:
        request[VERB], request[RESOURCE] = "create", "selfsubjectrulesreviews"
        _require_review(request[USER], "selfsubjectrulesreviews")
        body = await _review_body(request)
        return json_response(access_review.rules_review(request[USER], body), 201)

    async def _api(self, request: web.Request) -> web.Response:
        return json_response(discovery.api_versions(request.host))

    async def _apis(self, request: web.Request) -> web.Response:
        return json_response(discovery.api_group_list())

    async def _core_resources(self, request: web.Request) -> web.Response:
        return _or_404(discovery.api_resource_list(request.match_info["version"]))

    async def _group(self, request: web.Request) -> web.Response:
        return _or_404(discovery.api_group(request.match_info["group"]))

    async def _group_resources(self, request: web.Request) -> web.Response:
        info = request.match_info
        return _or_404(discovery.api_resource_list(f"{info['group']}/{info['version']}"))


def connection_server(
    server: web.Server, ssl_context: ssl.SSLContext | None, handshake_timeout: float
) -> Callable[[socket.socket], Awaitable[None]]:
    """Serve one accepted connection with aiohttp's ``server``, for ``podnet.listener``:
    a TLS handshake not done in ``handshake_timeout`` seconds is cut; it returns when
    the connection is closed (so the listener counts it until then)."""

    async def serve(conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        closed: asyncio.Future[None] = loop.create_future()
        timeout = handshake_timeout if ssl_context is not None else None
        await loop.connect_accepted_socket(
            lambda: _Watched(server(), closed), conn, ssl=ssl_context, ssl_handshake_timeout=timeout
        )
        await closed

    return serve


class _Watched(asyncio.Protocol):
    """aiohttp's protocol for one connection, and a future set when the connection ends."""

    def __init__(self, inner: asyncio.Protocol, closed: asyncio.Future[None]) -> None:
        self.inner = inner
        self.closed = closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self.inner.connection_lost(exc)
        finally:
            if not self.closed.done():
                self.closed.set_result(None)


def _peer_certificate(request: web.Request) -> bytes | None:
    """The client certificate of the request's TLS connection (DER), only when the TLS
    layer verified it against the CA (a context that verifies nothing yields None)."""
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    if not isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
        return None
    if ssl_object.context.verify_mode == ssl.CERT_NONE:
        return None
    return ssl_object.getpeercert(binary_form=True)


async def _review_body(request: web.Request) -> object:
    """A review's body: JSON/YAML, or the protobuf kubectl's typed client sends."""
    if request.content_type == "application/vnd.kubernetes.protobuf":
        from podnet.api import protobuf

        # The rules review (``can-i --list``) is not among the reader's kinds yet.
        spec: protobuf.Message = {1: ("namespace", "string")}
        table: protobuf.Message = {1: ("metadata", protobuf.OBJECT_META), 2: ("spec", spec)}
        protobuf.KINDS.setdefault((access_review.API_VERSION, access_review.SSRR), table)
        return protobuf.decode_object(await request.read())
    return await read_body(request)


def _or_404(body: object) -> web.Response:
    if body is None:
        raise errors.ApiError("the server could not find the requested resource", 404, "NotFound")
    return json_response(body)
