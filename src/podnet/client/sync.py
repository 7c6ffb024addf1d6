"""The synchronous client for the podnet API (Kubernetes-style REST), built on httpx: the
CLI's. Its calls take their arguments in the order of the asyncio client's
(``podnet.client.aio``) and of ``resource_path``: kind, then namespace (None for a
cluster-scoped kind, or for all namespaces in ``list``), then name. Failures are the
``podnet.client.errors`` tree: ``StatusError`` (and its subclasses) for an error answer or
a watch ``ERROR`` event, ``Unreachable``/``TLSFailure`` when no answer came,
``UnknownKind`` for a kind name the kind table does not know.

Pass ``transport=httpx.MockTransport(handler)`` to run the client against a fake API.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from podnet.client.errors import (
    TLSFailure,
    TransportError,
    Unreachable,
    caused_by,
    error_from_body,
    one_line,
)
from podnet.client.paths import KindRef, metadata, resolve_kind, resource_path
from podnet.client.tls import ssl_context
from podnet.client.watch import Obj, WatchEvent, decode_event
from podnet.client.wire import MERGE_PATCH, Call, headers, json_object, selectors, watch_params
from podnet.kubeconfig import ClientConfig

DEFAULT_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
# A watch may stay quiet for minutes; only connecting and writing are bounded.
WATCH_TIMEOUT = httpx.Timeout(connect=5.0, read=None, write=10.0, pool=5.0)


class ApiClient:
    """CRUD, list and watch on the podnet API for every kind in the kind table."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self._log = log
        verify: ssl.SSLContext | bool = True if transport else ssl_context(config)
        self._http = httpx.Client(
            base_url=config.server,
            headers=headers(config, "podnet-cli"),
            timeout=timeout,
            verify=verify,
            transport=transport,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, kind: KindRef, namespace: str | None, name: str) -> dict[str, Any]:
        """One object (``namespace`` None for a cluster-scoped kind)."""
        return self._send(Call("GET", resource_path(kind, namespace, name)))

    def list(self, kind: KindRef, namespace: str | None = None, **selector: str | None) -> Obj:
        """The List object of a kind, in one namespace or (``None``) in all of them;
        ``label_selector=`` and ``field_selector=`` filter it."""
        params = selectors(**selector)
        return self._send(Call("GET", resource_path(kind, namespace), params=params))

    def watch(
        self,
        kind: KindRef,
        since: str | None = None,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
    ) -> Iterator[WatchEvent]:
        """Stream the events after resourceVersion ``since`` (None: from now) until the
        server ends the watch.

        An ``ERROR`` event raises its error (``Expired`` for 410: relist).
        """
        params = {
            **watch_params(since, timeout_seconds),
            **selectors(label_selector, field_selector),
        }
        path = resource_path(kind, namespace)
        try:
            with self._http.stream("GET", path, params=params, timeout=WATCH_TIMEOUT) as resp:
                self._trace(resp)
                if not resp.is_success:
                    raise error_from_body(resp.status_code, resp.read(), resp.reason_phrase)
                for line in resp.iter_lines():
                    if line.strip():
                        yield decode_event(line)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc

    def create(
        self, kind: KindRef, obj: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """POST a new object; the namespace defaults to the object's own."""
        ns = namespace or metadata(obj).get("namespace")
        k = resolve_kind(kind)
        if k.namespaced and not ns:
            raise ValueError(f"a namespace is needed to create a {k.singular}")
        return self._send(Call("POST", resource_path(k, ns), obj))

    def replace(
        self, kind: KindRef, obj: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """PUT the whole object (its metadata.resourceVersion guards against lost updates)."""
        ns, name = namespace or metadata(obj).get("namespace"), metadata(obj).get("name")
        if not name:
            raise ValueError("the object to replace has no metadata.name")
        return self._send(Call("PUT", resource_path(kind, ns, str(name)), obj))

    def patch(
        self,
        kind: KindRef,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str = "",
    ) -> dict[str, Any]:
        """Apply a JSON merge patch (RFC 7386) to one object (or its ``subresource``)."""
        path = resource_path(kind, namespace, name, subresource)
        return self._send(Call("PATCH", path, patch, content_type=MERGE_PATCH))

    def delete(
        self,
        kind: KindRef,
        namespace: str | None,
        name: str,
        grace_period_seconds: int | None = None,
    ) -> dict[str, Any]:
        """Delete one object (a pod gracefully unless ``grace_period_seconds`` says
        otherwise: 0 removes it at once); returns what the server answers (a Status or
        the object)."""
        params = None
        if grace_period_seconds is not None:
            params = {"gracePeriodSeconds": str(grace_period_seconds)}
        return self._send(Call("DELETE", resource_path(kind, namespace, name), params=params))

    def _send(self, call: Call) -> dict[str, Any]:
        try:
            resp = self._http.request(
                call.method,
                call.path,
                params=call.params,
                content=call.content(),
                headers=call.headers(),
            )
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        self._trace(resp)
        if not resp.is_success:
            raise error_from_body(resp.status_code, resp.content, resp.reason_phrase)
        return json_object(resp.content, resp.status_code, f"{call.method} {resp.request.url}")

    def _unreachable(self, exc: httpx.TransportError) -> TransportError:
        if caused_by(exc, ssl.SSLCertVerificationError):
            return TLSFailure(self.config.server, one_line(exc))
        return Unreachable(self.config.server, one_line(exc))

    def _trace(self, resp: httpx.Response) -> None:
        if self._log is not None:
            req = resp.request
            self._log(f"{req.method} {req.url} {resp.status_code} {resp.reason_phrase}")
