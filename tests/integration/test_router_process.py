"""``podnet router`` for real: a master on etcd, the router process with its restricted
identity and a real HAProxy inside a network namespace the test makes, HTTP backends in
that namespace, clients (curl) there too.

The namespace's loopback carries the backends' addresses (10.199.0.0/24, inside the
namespace only); the master stays on the root namespace's
loopback and is reached from the namespace through ``podnet.cluster.relay``. Services
are selector-less with hand-written Endpoints, which the master's controllers mirror to
EndpointSlices (what the router reads). Everything is removed by exact name or PID,
also when a test fails. Waits are on readiness signals (a log line, an answer).
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
import pytest

from podnet import netns
from podnet.cluster.httpecho import handler_class
from podnet.master import router_credentials
from podnet.testing.api import client_for, namespace
from podnet.testing.e2e import Lines, wait_for
from podnet.testing.lab import unique_run
from podnet.testing.processes import MasterProcess, stop_process

pytestmark = [pytest.mark.root]

NS = "shop"
CORE = f"/api/v1/namespaces/{NS}"
ROUTES = f"/apis/route.openshift.io/v1/namespaces/{NS}/routes"
BACKENDS = {"a": "10.199.0.11", "b": "10.199.0.12", "c": "10.199.0.13"}
METRICS = "127.0.0.1:1936"


@dataclass
class Lab:
    """The namespace, its backends, the relay and the router's files."""

    ns: str
    master: MasterProcess
    work: Path
    kubeconfig: Path  # the router's restricted identity
    router: subprocess.Popen[str] | None = None
    lines: Lines | None = None

    @property
    def run_dir(self) -> Path:
        return self.work / "run"

    def start_router(self, *extra: str) -> None:
        """``podnet router`` in the namespace, once it says it listens."""
        argv = [sys.executable, "-m", "podnet", "--kubeconfig", str(self.kubeconfig), "router"]
        argv += ["--bind", "127.0.0.1", "--run-dir", str(self.run_dir), "--metrics", METRICS]
        argv += ["--reload-interval", "0.1", *extra]
        self.router = subprocess.Popen(
            netns.command(self.ns, argv),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
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

    def served_by(self, host: str, path: str = "/") -> str | None:
        """The backend that answered ``host``+``path`` over HTTP (None: not 200)."""
        code, body = self.curl(f"http://{host}{path}", "--resolve", f"{host}:80:127.0.0.1")
        match = re.search(r'"pod": "(\w+)"', body)
        return match.group(1) if code == 200 and match else None

    def metrics(self) -> str:
        return netns.run(self.ns, ["curl", "-sS", "-m", "5", f"http://{METRICS}/metrics"]).stdout


def _backends(ns: str) -> list[ThreadingHTTPServer]:
    """One HTTP echo server per backend address, its socket made inside ``ns``."""
    servers = []
    with netns.entered(ns):
        for name, ip in BACKENDS.items():
            servers.append(ThreadingHTTPServer((ip, 8080), handler_class(name, False)))
    for server in servers:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    return servers


@pytest.fixture
def lab(master: MasterProcess, tmp_path: Path) -> Iterator[Lab]:
    ns = unique_run("prt")
    relay: subprocess.Popen[bytes] | None = None
    servers: list[ThreadingHTTPServer] = []
    lab: Lab | None = None
    try:
        netns.create(ns)
        for ip in BACKENDS.values():  # on the namespace's own loopback
            argv = ["ip", "-n", ns, "addr", "add", f"{ip}/32", "dev", "lo"]
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
        servers = _backends(ns)
        relay = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "podnet.cluster.relay",
                "--netns",
                ns,
                "--port",
                str(master.port),
            ],
            stdout=subprocess.PIPE,
        )
        assert relay.stdout is not None and relay.stdout.readline().startswith(b"relay:")
        kubeconfig = tmp_path / "router.kubeconfig"
        router_credentials(master.state_dir, "default", kubeconfig=kubeconfig, server=master.server)
        with client_for(master.kubeconfig) as api:
            assert api.post("/api/v1/namespaces", json=namespace(NS)).status_code == 201
        lab = Lab(ns, master, tmp_path, kubeconfig)
        yield lab
    finally:
        if lab is not None and lab.router is not None:
            with contextlib.suppress(Exception):
                lab.stop_router()
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
    current = api.get(f"{CORE}/endpoints/{name}")
    addresses = [{"ip": BACKENDS[b]} for b in backends]
    subsets = (
        [{"addresses": addresses, "ports": [{"name": "http", "port": 8080}]}] if backends else []
    )
    body: dict[str, Any] = {"metadata": {"name": name}, "subsets": subsets}
    if current.status_code == 200:
        body["metadata"]["resourceVersion"] = current.json()["metadata"]["resourceVersion"]
        assert api.put(f"{CORE}/endpoints/{name}", json=body).status_code == 200
    else:
        assert api.post(f"{CORE}/endpoints", json=body).status_code == 201


def route(name: str, host: str, service: str = "web", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"host": host, "to": {"kind": "Service", "name": service}, **spec},
    }


def admitted(api: httpx.Client, name: str) -> dict[str, Any] | None:
    """The router's Admitted condition of route ``name``, once written."""
    stored = api.get(f"{ROUTES}/{name}").json()
    for entry in (stored.get("status") or {}).get("ingress") or []:
        if entry.get("routerName") == "default":
            return next(c for c in entry["conditions"] if c["type"] == "Admitted")
    return None


def test_routes_follow_endpoints_and_a_deleted_route_answers_503(lab: Lab) -> None:
    lab.start_router()
    with client_for(lab.master.kubeconfig) as api:
        service_with_endpoints(api, "web", ["a"])
        assert api.post(ROUTES, json=route("web", "www.example.com")).status_code == 201
        wait_for(lambda: lab.served_by("www.example.com") == "a", 30, "route served by a")
        condition = wait_for(lambda: admitted(api, "web"), 30, "status written")
        assert condition["status"] == "True"
        # unknown host: 503 from HAProxy's default backend
        assert (
            lab.curl(
                "http://nowhere.example.com/", "--resolve", "nowhere.example.com:80:127.0.0.1"
            )[0]
            == 503
        )

        set_endpoints(api, "web", ["b"])
        wait_for(lambda: lab.served_by("www.example.com") == "b", 30, "endpoints changed to b")
        set_endpoints(api, "web", ["b", "c"])
        seen = wait_for(
            lambda: {lab.served_by("www.example.com") for _ in range(6)} >= {"b", "c"} or None,
            30,
            "both b and c serve",
        )
        assert seen

        assert api.delete(f"{ROUTES}/web").status_code == 200
        wait_for(
            lambda: (
                lab.curl("http://www.example.com/", "--resolve", "www.example.com:80:127.0.0.1")[0]
                == 503
            ),
            30,
            "deleted route answers 503",
        )
