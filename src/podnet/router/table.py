"""The router's desired state: what HAProxy should serve, free of API and HAProxy detail.

A ``RouterTable`` is built by a pure function from the admitted Routes and the endpoints
of their services, and is the only input of the HAProxy renderer. Equal tables render to
equal files, so the driver can skip a reload when nothing changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Termination = Literal["http", "edge", "reencrypt", "passthrough"]
InsecurePolicy = Literal["None", "Allow", "Redirect"]


@dataclass(frozen=True, order=True)
class Server:
    """One endpoint (pod IP and port) behind a route, with its share of the traffic."""

    ip: str
    port: int
    weight: int = 1  # 0..256, as HAProxy takes it; 0 keeps the server but sends it nothing

    @property
    def name(self) -> str:
        """The server's name in HAProxy, after its address as OpenShift names it."""
        return f"ept:{self.ip}:{self.port}"


@dataclass(frozen=True)
class RouteBackend:
    """One admitted route: where requests for host+path go and how TLS is handled."""

    namespace: str
    name: str
    host: str  # lower case, no port
    path: str = ""  # "" or a path starting with "/"; always "" for passthrough
    termination: Termination = "http"
    insecure: InsecurePolicy = "None"  # plain-HTTP handling of edge/reencrypt routes
    servers: tuple[Server, ...] = ()
    # PEM: the route's certificate, its key and any CA chain, concatenated (edge and
    # reencrypt); None means the router's default certificate serves the host.
    certificate_pem: str | None = None
    destination_ca_pem: str | None = None  # reencrypt: CA that must sign the pod's cert
    sticky: bool = True  # cookie stickiness for HTTP-mode backends
    # The route's target service: a reencrypt backend's certificate must then name
    # <service>.<namespace>.svc (HAProxy verifyhost); "" checks only the CA.
    service: str = ""

    @property
    def key(self) -> str:
        """``<namespace>:<name>``: the backend's name after its route, as in OpenShift."""
        return f"{self.namespace}:{self.name}"


@dataclass(frozen=True)
class RouterTable:
    """Every route the router serves, in a stable order (by namespace, then name)."""

    routes: tuple[RouteBackend, ...] = field(default=())

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.routes, key=lambda r: (r.namespace, r.name)))
        object.__setattr__(self, "routes", ordered)

    def route(self, namespace: str, name: str) -> RouteBackend | None:
        for backend in self.routes:
            if backend.namespace == namespace and backend.name == name:
                return backend
        return None
