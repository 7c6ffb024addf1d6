"""``haproxy.cfg`` for a ``RouterTable``: the frontends, one backend per route, and the
server lines (shared with the runtime API's ``add server``).

Layout (after OpenShift's router): ``public`` serves plain HTTP by Host and path;
``public_ssl`` reads the TLS ClientHello and passes the connection on unopened for a
passthrough name, else over a unix socket (PROXY protocol, so the client address survives)
to ``fe_sni`` (route certificates from the crt-list, the default certificate otherwise) or
``fe_no_sni`` (default certificate). Relative paths are resolved against the config's own
directory (``default-path config``), so a generation directory is complete in itself.
"""

from __future__ import annotations

import functools
import hashlib

from podnet.router.haproxy import maps
from podnet.router.haproxy.settings import HAProxySettings
from podnet.router.table import RouteBackend, RouterTable, Server

DEFAULT_BACKEND = "openshift_default"  # no route: 503


_HTTP_FRONTEND = [
    "  mode http",
    # after a reload, an idle keep-alive connection is closed only after its next
    # response, so a client never sends a request into a connection being closed
    "  option idle-close-on-response",
    "  http-request set-header Host %[req.hdr(host),lower]",
]


def _ms(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def cookie_name(route: RouteBackend) -> str:
    """The sticky cookie's name: a hash of the backend, so it tells clients nothing."""
    return _digest("cookie", maps.backend_name(route))[:32]


def server_args(route: RouteBackend, server: Server) -> str:
    """What follows the server name on its ``server`` line or in ``add server``."""
    args = f"{server.ip}:{server.port} weight {server.weight}"
    if route.termination == "reencrypt":
        ca = maps.destination_ca_file(route) if maps.has_destination_ca(route) else "@system-ca"
        args += f" ssl verify required ca-file {ca}"
        if route.service:
            args += f" verifyhost {route.service}.{route.namespace}.svc"
    return args


def _global(settings: HAProxySettings) -> list[str]:
    return [
        "global",
        f"  maxconn {settings.maxconn}",
        f"  hard-stop-after {_ms(settings.hard_stop_after)}",
        "  default-path config",
        f"  stats socket {settings.stats_socket} mode 600 level admin expose-fd listeners",
        "  stats timeout 2m",
        f"  server-state-file {settings.state_file}",
        "  ssl-default-bind-options ssl-min-ver TLSv1.2",
        "  tune.ssl.default-dh-param 2048",
        "",
        "defaults",
        "  mode http",
        f"  maxconn {settings.maxconn}",
        f"  timeout connect {_ms(settings.timeout_connect)}",
        f"  timeout client {_ms(settings.timeout_client)}",
        f"  timeout server {_ms(settings.timeout_server)}",
        f"  timeout http-request {_ms(settings.timeout_http_request)}",
        f"  timeout http-keep-alive {_ms(settings.timeout_keep_alive)}",
        f"  timeout tunnel {_ms(settings.timeout_tunnel)}",
        "  option redispatch",
        "  load-server-state-from-file global",
        "",
    ]


def _public(settings: HAProxySettings) -> list[str]:
    return [
        "frontend public",
        f"  bind {settings.bind_address}:{settings.http_port}",
        *_HTTP_FRONTEND,
        f"  http-request set-var(txn.route) base,map_reg({maps.HTTP_MAP})",
        "  http-request redirect scheme https code 302 if "
        f"{{ var(txn.route),map({maps.REDIRECT_MAP}) -m found }}",
        "  use_backend %[var(txn.route)] if { var(txn.route) -m found }",
        f"  default_backend {DEFAULT_BACKEND}",
        "",
    ]


def _public_ssl(settings: HAProxySettings) -> list[str]:
    sni = "req.ssl_sni,lower"
    return [
        "frontend public_ssl",
        f"  bind {settings.bind_address}:{settings.https_port}",
        "  mode tcp",
        f"  timeout client {_ms(settings.timeout_client)}",
        "  tcp-request inspect-delay 5s",
        "  acl has_sni req.ssl_sni -m found",
        f"  acl passthrough {sni},map_reg({maps.PASSTHROUGH_MAP}) -m found",
        # a map named in use_backend's own expression is opened after default-path has
        # ended: look it up into a variable first (before "accept", which ends the rules)
        f"  tcp-request content set-var(txn.pass) {sni},map_reg({maps.TCP_MAP}) if passthrough",
        "  tcp-request content accept if { req_ssl_hello_type 1 }",
        "  use_backend %[var(txn.pass)] if has_sni passthrough",
        "  use_backend be_sni if has_sni",
        "  default_backend be_no_sni",
        "",
        "backend be_sni",
        "  mode tcp",
        f"  server fe_sni unix@{settings.sni_socket} send-proxy-v2",
        "",
        "backend be_no_sni",
        "  mode tcp",
        f"  server fe_no_sni unix@{settings.no_sni_socket} send-proxy-v2",
        "",
    ]


def _tls_frontend(name: str, bind: str) -> list[str]:
    return [
        f"frontend {name}",
        # only root may connect: a PROXY header from anyone else could forge a client
        f"  bind {bind} accept-proxy mode 600",
        *_HTTP_FRONTEND,
        f"  http-request set-var(txn.route) base,map_reg({maps.TLS_MAP})",
        "  use_backend %[var(txn.route)] if { var(txn.route) -m found }",
        f"  default_backend {DEFAULT_BACKEND}",
        "",
    ]


def _tls_frontends(settings: HAProxySettings) -> list[str]:
    cert = settings.default_certificate
    return [
        *_tls_frontend(
            "fe_sni", f"unix@{settings.sni_socket} ssl crt {cert} crt-list {maps.CRT_LIST}"
        ),
        *_tls_frontend("fe_no_sni", f"unix@{settings.no_sni_socket} ssl crt {cert}"),
        f"backend {DEFAULT_BACKEND}",
        "  mode http",
        "",
    ]


def _http_options(route: RouteBackend, secret: str) -> list[str]:
    lines = [
        "  mode http",
        "  balance roundrobin",
        "  option forwardfor",
        "  http-request set-header X-Forwarded-Host %[req.hdr(host)]",
        "  http-request set-header X-Forwarded-Port %[dst_port]",
        "  http-request set-header X-Forwarded-Proto http if !{ ssl_fc }",
        "  http-request set-header X-Forwarded-Proto https if { ssl_fc }",
    ]
    if route.sticky:
        # dynamic: a server's cookie is a hash of its address and the key, so a server
        # added over the runtime API gets one too, and the same one after a reload
        secure = " secure" if route.termination != "http" else ""
        lines += [
            f"  cookie {cookie_name(route)} insert indirect nocache httponly{secure} dynamic",
            f"  dynamic-cookie-key {_digest('key', secret, maps.backend_name(route))[:32]}",
        ]
    return lines


def backend(route: RouteBackend, secret: str) -> list[str]:
    """The route's backend section."""
    if route.termination == "passthrough":
        # source hashing keeps a client on one pod; "consistent" allows runtime servers
        options = ["  mode tcp", "  balance source", "  hash-type consistent"]
    else:
        options = _http_options(route, secret)
    servers = [f"  server {s.name} {server_args(route, s)}" for s in maps.servers_in_order(route)]
    return [f"backend {maps.backend_name(route)}", *options, *servers, ""]


def render_config(table: RouterTable, settings: HAProxySettings, secret: str) -> str:
    """The whole ``haproxy.cfg``; equal inputs give equal text."""
    lines = [
        "# Written by the podnet router; every reload replaces it.",
        *_global(settings),
        *_public(settings),
        *_public_ssl(settings),
        *_tls_frontends(settings),
    ]
    sections = [_backend_text(route, secret) for route in table.routes]
    return "\n".join([*lines, *sections])


@functools.lru_cache(maxsize=1 << 16)
def _backend_text(route: RouteBackend, secret: str) -> str:
    """``backend`` as text, kept for routes seen before: with 10,000 routes, a change of
    one renders one section (a frozen route hashes cheaply: its strings cache their hash)."""
    return "\n".join(backend(route, secret))
