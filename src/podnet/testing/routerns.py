"""``podnet router`` in a network namespace a test makes, for the router's integration
tests: a real master (root namespace loopback), the router with its restricted identity
and its HAProxy inside the namespace, HTTP echo backends and clients there too.

- ``router_namespace(master, work)``: the namespace (its loopback also carries the
  backends' addresses, ``BACKENDS``, 10.199.0.0/24: inside the namespace only), one
  ``httpecho`` server per backend (sockets made inside the namespace, served by
  threads of the test process), the API relay into the namespace
  (``podnet.cluster.relay``), the router's kubeconfig (``podnet router-credentials``)
  and the namespace ``shop``. Everything is removed by exact name or PID at the end,
  also on failure.
- ``RouterNamespace``: start/stop the router (by PID), ``curl`` from inside, which
  backend answered a host (HTTP or HTTPS), the router's metrics.
- Objects: a selector-less Service with hand-written Endpoints (the master mirrors them
  to EndpointSlices, which the router reads), Routes, this router's Admitted condition;
  ``weak_leaf``: a certificate the API takes and HAProxy refuses.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric import rsa

from podnet import netns
from podnet.cluster.httpecho import handler_class
from podnet.master import router_credentials
from podnet.router.defaultcert import self_signed_pem
from podnet.testing.api import client_for, namespace
from podnet.testing.e2e import Lines
from podnet.testing.lab import unique_run
from podnet.testing.processes import MasterProcess, stop_process

NS = "shop"
CORE = f"/api/v1/namespaces/{NS}"
ROUTES = f"/apis/route.openshift.io/v1/namespaces/{NS}/routes"
BACKENDS = {"a": "10.199.0.11", "b": "10.199.0.12", "c": "10.199.0.13"}
METRICS = "127.0.0.1:1936"
_POD = re.compile(r'"pod": "(\w+)"')
KEY_BEGIN = "-----BEGIN PRIVATE KEY-----"


@dataclass
class RouterNamespace:
    """The namespace, the master, the router's files and its process."""

    ns: str
    master: MasterProcess
    work: Path
    kubeconfig: Path  # the router's restricted identity
    router: subprocess.Popen[str] | None = None
    lines: Lines | None = None

    @property
    def run_dir(self) -> Path:
        return self.work / "run"

    def router_argv(self, *extra: str) -> list[str]:
        """``podnet router`` (its restricted identity, this run dir), inside the namespace."""
        argv = [sys.executable, "-m", "podnet", "--kubeconfig", str(self.kubeconfig), "router"]
        argv += ["--bind", "127.0.0.1", "--run-dir", str(self.run_dir), *extra]
        return netns.command(self.ns, argv)

    def start_router(self) -> None:
        """Start the router; return once it says it listens."""
        argv = self.router_argv("--metrics", METRICS, "--reload-interval", "0.1")
        self.router = subprocess.Popen(
            argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        assert self.router.stderr is not None
        self.lines = Lines(self.router.stderr)
        self.lines.wait_for("router default: HTTP on 127.0.0.1:80")

    def stop_router(self, sig: int = signal.SIGTERM) -> int:
        """Signal the router by PID; its exit code."""
        assert self.router is not None
        os.kill(self.router.pid, sig)
        code = self.router.wait(timeout=60)
        self.router = None
        return code

    def curl(self, url: str, *options: str) -> tuple[int, str]:
        """(HTTP status, body) of one request from inside the namespace (0: no answer)."""
        argv = ["curl", "-sS", "-m", "5", "-o", "-", "-w", "\n%{http_code}", *options, url]
        done = netns.run(self.ns, argv, timeout=15)
        body, _, code = done.stdout.rpartition("\n")
        return (int(code) if code.isdigit() else 0), body

    def status_of(self, host: str, https: bool = False) -> int:
        """The HTTP status the router gives ``host`` (0: no answer)."""
        scheme, port = ("https", 443) if https else ("http", 80)
        return self.curl(f"{scheme}://{host}/", "-k", "--resolve", f"{host}:{port}:127.0.0.1")[0]

    def served_by(self, host: str, https: bool = False) -> str | None:
        """The backend that answered ``host`` (None: no 200 answer)."""
        scheme, port = ("https", 443) if https else ("http", 80)
        url = f"{scheme}://{host}/"
        code, body = self.curl(url, "-k", "--resolve", f"{host}:{port}:127.0.0.1")
        match = _POD.search(body)
        return match.group(1) if code == 200 and match else None

    def metrics(self) -> str:
        return netns.run(self.ns, ["curl", "-sS", "-m", "5", f"http://{METRICS}/metrics"]).stdout


class _Backend(ThreadingHTTPServer):
    """An echo server that takes HAProxy's health checks (connect, then reset) quietly."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _backends(ns: str) -> list[ThreadingHTTPServer]:
    """One HTTP echo server per backend address, its socket made inside ``ns``."""
    servers: list[ThreadingHTTPServer] = []
    with netns.entered(ns):
        for name, ip in BACKENDS.items():
            servers.append(_Backend((ip, 8080), handler_class(name, False)))
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    return servers


def _relay(ns: str, port: int) -> subprocess.Popen[bytes]:
    """The master's port inside ``ns``, once the relay listens."""
    argv = [sys.executable, "-m", "podnet.cluster.relay", "--netns", ns, "--port", str(port)]
    relay = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert relay.stdout is not None
    if not relay.stdout.readline().startswith(b"relay:"):
        stop_process(relay)
        raise AssertionError("the API relay did not start")
    return relay


@contextlib.contextmanager
def router_namespace(master: MasterProcess, work: Path) -> Iterator[RouterNamespace]:
    """The module docstring's setup; everything removed at the end."""
    ns = unique_run("prt")
    relay: subprocess.Popen[bytes] | None = None
    servers: list[ThreadingHTTPServer] = []
    made: RouterNamespace | None = None
    try:
        netns.create(ns)
        for ip in BACKENDS.values():
            argv = ["ip", "-n", ns, "addr", "add", f"{ip}/32", "dev", "lo"]
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
        servers = _backends(ns)
        relay = _relay(ns, master.port)
        kubeconfig = work / "router.kubeconfig"
        router_credentials(master.state_dir, "default", kubeconfig=kubeconfig, server=master.server)
        with client_for(master.kubeconfig) as api:
            assert api.post("/api/v1/namespaces", json=namespace(NS)).status_code == 201
        made = RouterNamespace(ns, master, work, kubeconfig)
        yield made
    finally:
        if made is not None and made.router is not None:
            with contextlib.suppress(Exception):
                made.stop_router()
        for server in servers:
            server.shutdown()
            server.server_close()
        if relay is not None:
            stop_process(relay)
        netns.remove(ns)


def service_with_endpoints(api: httpx.Client, name: str, backends: list[str]) -> None:
    """A selector-less Service and its Endpoints on ``backends`` (names in BACKENDS)."""
    port = {"name": "http", "port": 80, "targetPort": 8080}
    svc = {"metadata": {"name": name}, "spec": {"ports": [port]}}
    assert api.post(f"{CORE}/services", json=svc).status_code == 201
    set_endpoints(api, name, backends)


def set_endpoints(api: httpx.Client, name: str, backends: list[str]) -> None:
    """Write the Endpoints of ``name``: the ``backends`` on port 8080."""
    current = api.get(f"{CORE}/endpoints/{name}")
    addresses = [{"ip": BACKENDS[b]} for b in backends]
    ports = [{"name": "http", "port": 8080}]
    subsets = [{"addresses": addresses, "ports": ports}] if backends else []
    body: dict[str, Any] = {"metadata": {"name": name}, "subsets": subsets}
    if current.status_code == 200:
        body["metadata"]["resourceVersion"] = current.json()["metadata"]["resourceVersion"]
        assert api.put(f"{CORE}/endpoints/{name}", json=body).status_code == 200
    else:
        assert api.post(f"{CORE}/endpoints", json=body).status_code == 201


def route(name: str, host: str, service: str = "web", **spec: Any) -> dict[str, Any]:
    """A Route of ``host`` to ``service``; ``spec`` adds fields (``tls=edge(...)``)."""
    target = {"kind": "Service", "name": service}
    return {"metadata": {"name": name}, "spec": {"host": host, "to": target, **spec}}


def edge(certificate: str, key: str) -> dict[str, Any]:
    """An edge ``spec.tls`` with the route's own certificate."""
    return {"termination": "edge", "certificate": certificate, "key": key}


def admitted(api: httpx.Client, name: str) -> dict[str, Any] | None:
    """Router ``default``'s Admitted condition of route ``name``, once written."""
    stored = api.get(f"{ROUTES}/{name}").json()
    for entry in (stored.get("status") or {}).get("ingress") or []:
        if entry.get("routerName") == "default":
            return next(c for c in entry["conditions"] if c["type"] == "Admitted")
    return None


def sample(text: str, name: str, route_name: str) -> float | None:
    """The value of metric ``name`` for route ``shop/<route_name>`` in ``text``."""
    for line in text.splitlines():
        if line.startswith(f'{name}{{namespace="{NS}",route="{route_name}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def weak_leaf(host: str) -> tuple[str, str]:
    """(certificate, key) the API takes (well-formed, the key its own) that HAProxy
    refuses to load: a 1024-bit RSA key, below OpenSSL's default security level."""
    pem = self_signed_pem(host, rsa.generate_private_key(65537, 1024)).decode()
    certificate, key_block = pem.split(KEY_BEGIN)
    return certificate, KEY_BEGIN + key_block
