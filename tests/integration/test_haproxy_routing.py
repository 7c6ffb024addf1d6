"""The router's HAProxy serving a table, with real clients in a project namespace: host and
path routing, 503 for unknown hosts, edge/reencrypt/passthrough TLS, insecure policies,
forwarded headers, sticky cookies and weights."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from podnet.router.table import RouteBackend, RouterTable, Server
from podnet.testing import haproxylab, tools
from podnet.testing.haproxylab import Lab, LabCA

pytestmark = [pytest.mark.root]

A, B = Server("127.0.0.11", 8080), Server("127.0.0.12", 8080)
SECURE = Server("127.0.0.14", 8443)  # serves a certificate for svc-re.ns1.svc
POD_TLS = Server("127.0.0.15", 8443)  # passthrough: the pod's own certificate


@dataclass
class Env:
    lab: Lab
    ca: LabCA
    ca_file: Path


def routes(ca: LabCA) -> tuple[RouteBackend, ...]:
    wrong_ca = LabCA.create("wrong-ca")

    def edge(name: str, insecure: str) -> RouteBackend:
        host = f"{name}.example.com"
        return RouteBackend(
            "ns1",
            name,
            host,
            termination="edge",
            insecure=insecure,  # type: ignore[arg-type]
            certificate_pem=ca.issue(host),
            servers=(A,),
        )

    def reencrypt(name: str, dest_ca: LabCA, service: str) -> RouteBackend:
        return RouteBackend(
            "ns1",
            name,
            f"{name}.example.com",
            termination="reencrypt",
            certificate_pem=ca.issue(f"{name}.example.com"),
            destination_ca_pem=dest_ca.pem,
            service=service,
            servers=(SECURE,),
        )

    return (
        RouteBackend("ns1", "root", "www.example.com", servers=(A,)),
        RouteBackend("ns1", "api", "www.example.com", "/api", servers=(B,)),
        RouteBackend(
            "ns2",
            "weighted",
            "w.example.com",
            sticky=False,
            servers=(Server(A.ip, A.port, 3), Server(B.ip, B.port, 1)),
        ),
        RouteBackend("ns2", "sticky", "s.example.com", servers=(A, B)),
        edge("redirect", "Redirect"),
        edge("allow", "Allow"),
        edge("none", "None"),
        reencrypt("re", ca, "svc-re"),
        reencrypt("re-wrong-ca", wrong_ca, "svc-re"),
        reencrypt("re-wrong-host", ca, "other"),
        RouteBackend("ns1", "pt", "pt.example.com", termination="passthrough", servers=(POD_TLS,)),
    )


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    for tool in ("haproxy", "openssl", "curl"):
        tools.require(tool, (2, 6) if tool == "haproxy" else None)
    ca = LabCA.create("test-ca")
    with haproxylab.lab("hxroute") as lab:
        lab.backend(A.ip, A.port, "a")
        lab.backend(B.ip, B.port, "b")
        lab.backend(SECURE.ip, SECURE.port, "secure", ca.issue("svc-re.ns1.svc"))
        lab.backend(POD_TLS.ip, POD_TLS.port, "pod", ca.issue("pod-pt.internal"))
        ca_file = lab.work / "ca.pem"
        ca_file.write_text(ca.pem)
        with haproxylab.running_router(lab, RouterTable(routes=routes(ca))):
            yield Env(lab, ca, ca_file)


def curl(env: Env, url: str, *args: str) -> tuple[int, dict[str, str], str]:
    """status, headers (lower-case names) and body of one request from the namespace."""
    done = env.lab.run("curl", "-sk", "-i", "--max-time", "10", *args, url)
    assert done.returncode == 0, done.stderr
    head, _, body = done.stdout.replace("\r\n", "\n").partition("\n\n")
    status = int(head.split()[1])
    headers = dict(line.lower().split(": ", 1) for line in head.splitlines()[1:])
    return status, headers, body


def http(env: Env, host: str, path: str = "/", *args: str) -> tuple[int, dict[str, str], str]:
    return curl(env, f"http://127.0.0.1{path}", "-H", f"Host: {host}", *args)


def https(env: Env, host: str, path: str = "/") -> tuple[int, dict[str, str], str]:
    return curl(env, f"https://{host}{path}", "--resolve", f"{host}:443:127.0.0.1")


def tag(body: str) -> str:
    return str(json.loads(body)["tag"])


def presented(env: Env, servername: str | None) -> tuple[str, str]:
    """The certificate subject HAProxy (or the pod) presents, and the verify result."""
    sni = ["-servername", servername] if servername else ["-noservername"]
    argv = ["openssl", "s_client", "-connect", "127.0.0.1:443", *sni, "-CAfile", str(env.ca_file)]
    done = env.lab.run(*argv, "-verify_return_error", timeout=30)
    out = done.stdout + done.stderr
    subject = re.search(r"^subject=(.*)$", out, re.M)
    verify = re.search(r"Verify return code: (\d+)", out)
    return (subject.group(1) if subject else out[-300:]), (verify.group(1) if verify else "?")


def test_host_and_path_routing_longest_path_first(env: Env):
    assert tag(http(env, "www.example.com", "/api/users")[2]) == "b"
    assert tag(http(env, "www.example.com", "/api")[2]) == "b"
    assert tag(http(env, "www.example.com", "/apiary")[2]) == "a"
    assert tag(http(env, "www.example.com", "/")[2]) == "a"


def test_host_is_case_insensitive_and_may_carry_a_port(env: Env):
    assert tag(http(env, "WWW.Example.COM", "/api/x")[2]) == "b"
    assert tag(http(env, "www.example.com:80", "/x")[2]) == "a"


def test_unknown_host_gets_503(env: Env):
    assert http(env, "nobody.example.com")[0] == 503
    assert https(env, "nobody.example.com")[0] == 503


def test_edge_serves_the_routes_certificate(env: Env):
    subject, verify = presented(env, "allow.example.com")
    assert "CN = allow.example.com" in subject and verify == "0"
    status, _, body = https(env, "allow.example.com", "/p")
    assert status == 200 and tag(body) == "a"


def test_insecure_policies(env: Env):
    status, headers, _ = http(env, "redirect.example.com", "/x")
    assert status == 302 and headers["location"] == "https://redirect.example.com/x"
    assert tag(http(env, "allow.example.com")[2]) == "a"
    assert http(env, "none.example.com")[0] == 503
    assert tag(https(env, "none.example.com")[2]) == "a"
    assert tag(https(env, "redirect.example.com")[2]) == "a"


def test_reencrypt_verifies_the_pod_against_the_destination_ca(env: Env):
    status, _, body = https(env, "re.example.com")
    assert status == 200 and tag(body) == "secure"
    assert presented(env, "re.example.com")[0].endswith("CN = re.example.com")
    assert https(env, "re-wrong-ca.example.com")[0] == 503
    assert https(env, "re-wrong-host.example.com")[0] == 503  # cert is not for other.ns1.svc


def test_passthrough_shows_the_pods_own_certificate(env: Env):
    subject, verify = presented(env, "pt.example.com")
    assert "CN = pod-pt.internal" in subject and verify == "0"
    status, _, body = https(env, "pt.example.com")
    assert status == 200 and tag(body) == "pod"


def test_default_certificate_for_unknown_or_no_sni(env: Env):
    assert "CN = router-default" in presented(env, "unknown.example.com")[0]
    assert "CN = router-default" in presented(env, None)[0]


def test_forwarded_headers(env: Env):
    plain = json.loads(http(env, "www.example.com", "/", "-H", "X-Forwarded-Proto: https")[2])
    headers = {k.lower(): v for k, v in plain["headers"].items()}
    assert headers["x-forwarded-for"] == "127.0.0.1"
    assert headers["x-forwarded-proto"] == "http"  # the client's own value is replaced
    assert headers["x-forwarded-host"] == "www.example.com"
    assert headers["x-forwarded-port"] == "80"
    tls = json.loads(https(env, "allow.example.com")[2])
    headers = {k.lower(): v for k, v in tls["headers"].items()}
    assert headers["x-forwarded-proto"] == "https" and headers["x-forwarded-port"] == "443"
    assert headers["x-forwarded-for"] == "127.0.0.1"


def test_sticky_cookie_keeps_a_client_on_its_server(env: Env):
    _, headers, body = http(env, "s.example.com")
    cookie = headers["set-cookie"].split(";", 1)[0]
    first = tag(body)
    for _ in range(6):
        assert tag(http(env, "s.example.com", "/", "-H", f"Cookie: {cookie}")[2]) == first
    others = {tag(http(env, "s.example.com")[2]) for _ in range(4)}
    assert others == {"a", "b"}  # without the cookie both servers take requests


def test_weights_three_to_one_over_400_requests(env: Env):
    urls = ["http://127.0.0.1/"] * 400
    done = env.lab.run("curl", "-s", "-H", "Host: w.example.com", *urls, timeout=120)
    assert done.returncode == 0, done.stderr
    counts = Counter(m.group(1) for m in re.finditer(r'"tag": "(\w+)"', done.stdout))
    assert sum(counts.values()) == 400
    assert abs(counts["a"] - 300) <= 30 and abs(counts["b"] - 100) <= 10, counts
