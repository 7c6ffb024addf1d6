"""The map files and the crt-list: which backend serves a host and path, and which
certificate a host gets.

HAProxy reads a map top to bottom and the first matching regex wins, so the entries of a
host are written with its longest path first. Keys match HAProxy's ``base`` (the Host
header, lower-cased by the frontend, then the path without the query) or the SNI name.
"""

from __future__ import annotations

from collections.abc import Iterable

from podnet.router.table import RouteBackend, RouterTable, Server

HTTP_MAP = "os_http_be.map"  # plain HTTP: http routes, edge/reencrypt with Allow or Redirect
TLS_MAP = "os_edge_reencrypt_be.map"  # TLS terminated here: edge and reencrypt routes
REDIRECT_MAP = "os_route_http_redirect.map"  # backends whose plain-HTTP requests get a 302
TCP_MAP = "os_tcp_be.map"  # SNI name → passthrough backend
PASSTHROUGH_MAP = "os_sni_passthrough.map"  # SNI names that are passed through
CRT_LIST = "cert_config.map"  # route certificate → host, for the SNI frontend
MAPS = (HTTP_MAP, TLS_MAP, REDIRECT_MAP, TCP_MAP, PASSTHROUGH_MAP, CRT_LIST)

_REGEX_SPECIAL = set(".^$*+?()[]{}|\\")


def _literal(text: str) -> str:
    """``text`` as a regex matching itself, with no whitespace, ``#`` or control
    character left bare (a map line is ``key value``, split on whitespace)."""
    out = []
    for ch in text:
        if ch in _REGEX_SPECIAL:
            out.append("\\" + ch)
        elif ch.isspace() or ch == "#" or not ch.isprintable() or ord(ch) > 126:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
        else:
            out.append(ch)
    return "".join(out)


def route_path(route: RouteBackend) -> str:
    """The route's path as it is matched: no trailing ``/`` (``/`` alone is no path)."""
    return route.path.rstrip("/")


def http_key(host: str, path: str) -> str:
    """Matches ``host`` (any port, an optional trailing dot) and ``path`` or below it."""
    return f"^{_literal(host)}\\.?(:[0-9]+)?{_literal(path)}(/.*)?$"


def sni_key(host: str) -> str:
    """Matches the SNI name ``host`` (with an optional trailing dot)."""
    return f"^{_literal(host)}\\.?$"


def backend_name(route: RouteBackend) -> str:
    """The route's backend: its kind after the termination, then ``<ns>:<name>``."""
    kind = {
        "http": "be_http",
        "edge": "be_edge_http",
        "reencrypt": "be_secure",
        "passthrough": "be_tcp",
    }[route.termination]
    return f"{kind}:{route.key}"


def certificate_file(route: RouteBackend) -> str:
    """The route's certificate (with its key), relative to the generation directory."""
    return f"certs/{route.key}.pem"


def destination_ca_file(route: RouteBackend) -> str:
    """The CA a reencrypt route's pods must present a certificate from."""
    return f"cacerts/{route.key}.pem"


def _longest_first(routes: Iterable[RouteBackend]) -> list[RouteBackend]:
    """Per host, longer paths before their prefixes; hosts in a stable order."""
    return sorted(routes, key=lambda r: (r.host, route_path(r), r.key), reverse=True)


def _lines(entries: Iterable[tuple[str, str]]) -> str:
    return "".join(f"{key} {value}\n" for key, value in entries)


def http_map(table: RouterTable) -> str:
    """Host+path → backend for plain HTTP. Redirect routes are here too, so the longest
    path decides for them as well; ``redirect_map`` then turns their requests into 302s."""
    routes = [r for r in table.routes if r.termination == "http" or _insecure_served(r)]
    return _lines(
        (http_key(r.host, route_path(r)), backend_name(r)) for r in _longest_first(routes)
    )


def tls_map(table: RouterTable) -> str:
    """Host+path → backend for requests whose TLS the router terminates."""
    routes = [r for r in table.routes if r.termination in ("edge", "reencrypt")]
    return _lines(
        (http_key(r.host, route_path(r)), backend_name(r)) for r in _longest_first(routes)
    )


def redirect_map(table: RouterTable) -> str:
    """Backends whose plain-HTTP requests are redirected to HTTPS (exact backend names)."""
    names = sorted(backend_name(r) for r in table.routes if _redirected(r))
    return _lines((name, "1") for name in names)


def tcp_map(table: RouterTable) -> str:
    """SNI name → passthrough backend."""
    routes = _longest_first(r for r in table.routes if r.termination == "passthrough")
    return _lines((sni_key(r.host), backend_name(r)) for r in routes)


def passthrough_map(table: RouterTable) -> str:
    """The SNI names the TLS frontend hands on unopened."""
    routes = _longest_first(r for r in table.routes if r.termination == "passthrough")
    return _lines((sni_key(r.host), "1") for r in routes)


def crt_list(table: RouterTable) -> str:
    """One line per route with its own certificate: the file and the name it serves."""
    routes = sorted((r for r in table.routes if has_certificate(r)), key=lambda r: (r.host, r.key))
    return "".join(f"{certificate_file(r)} {r.host}\n" for r in routes)


def has_certificate(route: RouteBackend) -> bool:
    return route.termination in ("edge", "reencrypt") and bool(route.certificate_pem)


def has_destination_ca(route: RouteBackend) -> bool:
    return route.termination == "reencrypt" and bool(route.destination_ca_pem)


def _insecure_served(route: RouteBackend) -> bool:
    return route.termination in ("edge", "reencrypt") and route.insecure in ("Allow", "Redirect")


def _redirected(route: RouteBackend) -> bool:
    return route.termination in ("edge", "reencrypt") and route.insecure == "Redirect"


def servers_in_order(route: RouteBackend) -> list[Server]:
    """The route's servers by name, each once (the first of duplicates wins)."""
    seen: dict[str, Server] = {}
    for server in route.servers:
        seen.setdefault(server.name, server)
    return [seen[name] for name in sorted(seen)]
