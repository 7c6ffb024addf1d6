"""The HAProxy renderer: maps (keys, longest path first), crt-list, config key lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.router.haproxy import HAProxySettings, SettingsError, maps, render
from podnet.router.haproxy.config import render_config
from podnet.router.table import RouteBackend, RouterTable, Server

SETTINGS = HAProxySettings(run_dir=Path("/run/r"), default_certificate=Path("/etc/r/d.pem"))
CERT = "-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n"
ONE = (Server("10.128.0.5", 8080),)


def route(name: str, host: str, path: str = "", **kw: object) -> RouteBackend:
    return RouteBackend("ns1", name, host, path, servers=kw.pop("servers", ONE), **kw)  # type: ignore[arg-type]


def lines(text: str) -> list[str]:
    return text.splitlines()


def test_http_keys_match_host_any_port_and_the_path_below():
    key = maps.http_key("www.example.com", "/api")
    assert key == r"^www\.example\.com\.?(:[0-9]+)?/api(/.*)?$"
    pattern = re.compile(key)
    for base in ("www.example.com/api", "www.example.com:8080/api/v1", "www.example.com./api"):
        assert pattern.match(base), base
    for base in ("www.example.com/apiary", "wwwxexample.com/api", "a.www.example.com/api"):
        assert not pattern.match(base), base


def test_keys_escape_regex_and_map_separators():
    key = maps.http_key("my-app.example.com", "/a b#c+(d)")
    assert "my-app" in key  # '-' needs no escape
    assert r"/a\x20b\x23c\+\(d\)" in key
    assert " " not in key and "#" not in key
    assert re.match(key, "my-app.example.com/a b#c+(d)/x")


def test_longest_path_first_per_host_and_map_values():
    table = RouterTable(
        routes=(
            route("root", "www.example.com"),
            route("api", "www.example.com", "/api"),
            route("v1", "www.example.com", "/api/v1"),
            route("other", "other.example.com", "/x"),
        )
    )
    entries = [line.split() for line in lines(maps.http_map(table))]
    values = [value for _, value in entries]
    assert values.index("be_http:ns1:v1") < values.index("be_http:ns1:api")
    assert values.index("be_http:ns1:api") < values.index("be_http:ns1:root")
    assert len(entries) == 4


def _first_match(text: str, base: str) -> str | None:
    for key, value in (line.split() for line in lines(text)):
        if re.match(key, base):
            return value
    return None


segments = st.lists(st.text("ab.", min_size=1, max_size=3), min_size=1, max_size=3)
paths = st.lists(segments.map(lambda s: "/" + "/".join(s)), min_size=1, max_size=6, unique=True)


@settings(deadline=None)  # no wall-clock limit on a shared machine
@given(paths=paths, request=st.text("ab./", max_size=10))
def test_first_match_is_the_longest_matching_path(paths: list[str], request: str):
    routes = [route(f"r{i}", "h.example.com", p) for i, p in enumerate(paths)]
    table = RouterTable(routes=(route("root", "h.example.com"), *routes))
    request_path = "/" + request
    got = _first_match(maps.http_map(table), "h.example.com" + request_path)

    def covers(path: str) -> bool:
        path = path.rstrip("/")
        return request_path == path or request_path.startswith(path + "/")

    best = max((r for r in table.routes if covers(r.path)), key=lambda r: len(r.path.rstrip("/")))
    assert got == f"be_http:{best.key}"


def test_insecure_policies_decide_the_plain_http_maps():
    table = RouterTable(
        routes=(
            route("none", "a.example.com", termination="edge"),
            route("allow", "b.example.com", termination="edge", insecure="Allow"),
            route("redir", "c.example.com", termination="reencrypt", insecure="Redirect"),
        )
    )
    http = maps.http_map(table)
    assert "be_edge_http:ns1:none" not in http
    assert "be_edge_http:ns1:allow" in http
    assert "be_secure:ns1:redir" in http  # the longest path decides for redirects too
    assert maps.redirect_map(table) == "be_secure:ns1:redir 1\n"
    tls_values = {line.split()[1] for line in lines(maps.tls_map(table))}
    assert tls_values == {"be_edge_http:ns1:none", "be_edge_http:ns1:allow", "be_secure:ns1:redir"}


def test_passthrough_maps_and_crt_list():
    table = RouterTable(
        routes=(
            route("pt", "pt.example.com", termination="passthrough"),
            route("edge", "edge.example.com", termination="edge", certificate_pem=CERT),
            route("plain-edge", "d.example.com", termination="edge"),
        )
    )
    assert maps.tcp_map(table) == "^pt\\.example\\.com\\.?$ be_tcp:ns1:pt\n"
    assert maps.passthrough_map(table) == "^pt\\.example\\.com\\.?$ 1\n"
    assert maps.crt_list(table) == "certs/ns1:edge.pem edge.example.com\n"
    assert maps.http_map(table) == ""  # passthrough and edge with None: no plain HTTP


def test_generation_files_and_modes():
    table = RouterTable(
        routes=(
            route("edge", "e.example.com", termination="edge", certificate_pem=CERT),
            route("re", "r.example.com", termination="reencrypt", destination_ca_pem=CERT),
        )
    )
    generation = render(table, SETTINGS, "s3cret")
    assert set(generation.files) == {
        "haproxy.cfg",
        *maps.MAPS,
        "certs/ns1:edge.pem",
        "cacerts/ns1:re.pem",
    }
    assert generation.mode("certs/ns1:edge.pem") == 0o600
    assert generation.mode("os_http_be.map") == 0o644


def test_equal_tables_render_equal_files_whatever_the_order():
    a = route("a", "a.example.com", servers=(Server("10.0.0.2", 80), Server("10.0.0.1", 80)))
    b = route("b", "b.example.com", "/x")
    one = render(RouterTable(routes=(a, b)), SETTINGS, "k")
    two = render(
        RouterTable(routes=(b, a.__class__(**{**a.__dict__, "servers": a.servers[::-1]}))),
        SETTINGS,
        "k",
    )
    assert one == two


def test_config_key_lines():
    table = RouterTable(
        routes=(
            route("web", "w.example.com", servers=(Server("10.0.0.1", 8080, 3),)),
            route(
                "re",
                "r.example.com",
                termination="reencrypt",
                destination_ca_pem=CERT,
                service="svc",
            ),
            route("pt", "p.example.com", termination="passthrough"),
            route("ns", "n.example.com", sticky=False),
        )
    )
    text = render_config(table, SETTINGS, "k")
    assert "  stats socket /run/r/haproxy.sock mode 600 level admin expose-fd listeners" in text
    assert "  server-state-file /run/r/server-state" in text
    assert "  hard-stop-after 30000ms" in text
    assert "  option idle-close-on-response" in text
    assert "  bind 0.0.0.0:80" in text and "  bind 0.0.0.0:443" in text
    assert "  server ept:10.0.0.1:8080 10.0.0.1:8080 weight 3" in text
    assert (
        "  server ept:10.128.0.5:8080 10.128.0.5:8080 weight 1 ssl verify required"
        " ca-file cacerts/ns1:re.pem verifyhost svc.ns1.svc" in text
    )
    tcp = text.split("backend be_tcp:ns1:pt\n", 1)[1].split("\n\n", 1)[0]
    assert "balance source" in tcp and "hash-type consistent" in tcp and "cookie" not in tcp
    web = text.split("backend be_http:ns1:web\n", 1)[1].split("\n\n", 1)[0]
    assert "insert indirect nocache httponly dynamic" in web and "dynamic-cookie-key" in web
    assert "option forwardfor" in web and "X-Forwarded-Proto https if { ssl_fc }" in web
    unsticky = text.split("backend be_http:ns1:ns\n", 1)[1].split("\n\n", 1)[0]
    assert "cookie" not in unsticky
    assert "crt /etc/r/d.pem crt-list cert_config.map" in text
    assert "backend openshift_default" in text


def test_reencrypt_without_destination_ca_uses_the_system_cas():
    text = render_config(
        RouterTable(routes=(route("re", "r.x", termination="reencrypt"),)), SETTINGS, "k"
    )
    assert "ssl verify required ca-file @system-ca" in text
    assert "verifyhost" not in text


def test_cookie_key_follows_the_secret():
    table = RouterTable(routes=(route("web", "w.example.com"),))
    assert render_config(table, SETTINGS, "a") != render_config(table, SETTINGS, "b")


def test_settings_refuse_a_socket_path_too_long_and_bad_ports():
    with pytest.raises(SettingsError, match="too long"):
        HAProxySettings(run_dir=Path("/" + "x" * 120), default_certificate=Path("/d.pem"))
    with pytest.raises(SettingsError, match="port"):
        HAProxySettings(run_dir=Path("/r"), default_certificate=Path("/d"), http_port=0)
    with pytest.raises(SettingsError, match="open files"):
        HAProxySettings(run_dir=Path("/r"), default_certificate=Path("/d"), maxconn=10**9)
