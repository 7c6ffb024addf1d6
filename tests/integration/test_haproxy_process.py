"""The router's HAProxy process: adopted by a restarted router, stopped by PID, counting
requests and errors per route across reloads, and its sockets and files closed to other
users."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from podnet.router.haproxy import ConfigRejected, HAProxyRouter
from podnet.router.table import RouteBackend, RouterTable, Server
from podnet.testing import haproxylab, tools
from podnet.testing.haproxylab import Lab, LabCA, LoopThread, apply

pytestmark = [pytest.mark.root]

A = Server("127.0.0.31", 8080)
NOBODY_LISTENS = Server("127.0.0.32", 8080)
CA = LabCA.create("process-ca")
WEB, EDGE = haproxylab.web_and_edge(CA, web=(A,), edge=(A,))
ROUTES = (WEB, RouteBackend("ns1", "down", "down.example.com", servers=(NOBODY_LISTENS,)), EDGE)
CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("refused")
else:
    print("connected")
"""


@pytest.fixture
def lab() -> Iterator[Lab]:
    tools.require("haproxy", (2, 6))
    tools.require("curl")
    with haproxylab.lab("hxproc") as the_lab:
        the_lab.backend(A.ip, A.port, "a")
        yield the_lab


@pytest.fixture
def router(lab: Lab) -> Iterator[tuple[LoopThread, HAProxyRouter]]:
    with haproxylab.running_router(lab, RouterTable(routes=ROUTES)) as running:
        yield running


def running(pid: int) -> bool:
    """The process is there and not a zombie (the first router, its parent, is this test
    and reaps it only when its fixture ends)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def get(lab: Lab, host: str, count: int = 1) -> list[str]:
    urls = ["-o", "/dev/null", "http://127.0.0.1/"] * count
    done = lab.run("curl", "-s", "-w", "%{http_code}\n", "-H", f"Host: {host}", *urls)
    return done.stdout.split()


def test_a_restarted_router_adopts_the_running_haproxy(
    lab: Lab, router: tuple[LoopThread, HAProxyRouter]
):
    loop, first = router
    master = first.master.pid
    assert master is not None and first.settings.pid_file.read_text().split()[0] == str(master)
    # the first router is gone without stopping HAProxy; the next one takes it over
    second = HAProxyRouter(first.settings)
    table = RouterTable(
        routes=(*ROUTES, RouteBackend("ns1", "new", "new.example.com", servers=(A,)))
    )
    loop.call(second.start(table))
    assert second.master.pid == master and second.counters.reloads == 1
    assert get(lab, "new.example.com") == ["200"]
    loop.call(second.stop(grace=5.0))
    assert not running(master)
    assert get(lab, "web.example.com") == ["000"]  # nothing listens any more


def test_requests_and_errors_per_route_survive_reloads(
    lab: Lab, router: tuple[LoopThread, HAProxyRouter]
):
    loop, haproxy = router
    assert get(lab, "web.example.com", 10) == ["200"] * 10
    assert get(lab, "down.example.com", 2) == ["503"] * 2
    stats = loop.call(haproxy.backend_stats())
    assert stats["be_http:ns1:web"].requests == 10 and stats["be_http:ns1:web"].errors == 0
    assert stats["be_http:ns1:down"].requests == 2 and stats["be_http:ns1:down"].errors == 2
    assert stats["be_edge_http:ns1:edge"].route == "ns1:edge"
    extra = RouteBackend("ns1", "extra", "extra.example.com", servers=(A,))
    assert apply(loop, haproxy, RouterTable(routes=(*ROUTES, extra))).reloads == 1
    assert get(lab, "web.example.com", 5) == ["200"] * 5
    stats = loop.call(haproxy.backend_stats())
    assert stats["be_http:ns1:web"].requests == 15
    assert stats["be_http:ns1:extra"].requests == 0
    # requests counted by a worker after the last read are kept across the next reload
    assert get(lab, "web.example.com", 3) == ["200"] * 3
    assert apply(loop, haproxy, RouterTable(routes=ROUTES)).reloads == 2
    assert loop.call(haproxy.backend_stats())["be_http:ns1:web"].requests == 18


def test_sockets_and_secrets_are_root_only(lab: Lab, router: tuple[LoopThread, HAProxyRouter]):
    _, haproxy = router
    settings = haproxy.settings
    sockets = [
        settings.stats_socket,
        settings.master_socket,
        settings.sni_socket,
        settings.no_sni_socket,
    ]
    for path in sockets:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        # another user is refused: no runtime API, no forged PROXY header into fe_sni
        done = lab.run(
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            CONNECT,
            str(path),
        )
        assert done.stdout.strip() == "refused", (path, done.stdout, done.stderr)
    assert stat.S_IMODE(settings.run_dir.stat().st_mode) == 0o700
    live = settings.current.resolve()
    assert stat.S_IMODE(live.stat().st_mode) == 0o700
    assert stat.S_IMODE((live / "certs" / "ns1:edge.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((settings.run_dir / "cookie-secret").stat().st_mode) == 0o600


def test_a_dead_haproxy_is_started_again(lab: Lab, router: tuple[LoopThread, HAProxyRouter]):
    loop, haproxy = router
    master = haproxy.master.pid
    assert master is not None
    os.kill(master, signal.SIGKILL)

    async def restarted() -> int:
        while haproxy.counters.restarts == 0:  # the driver's watch notices within 2 s
            await asyncio.sleep(0.05)
        return haproxy.counters.restarts

    assert loop.call(restarted(), timeout=60) == 1
    assert haproxy.master.pid not in (None, master)
    assert get(lab, "web.example.com", 3) == ["200"] * 3


def test_check_never_serves_what_it_checks(lab: Lab, router: tuple[LoopThread, HAProxyRouter]):
    loop, haproxy = router
    settings = haproxy.settings
    live = settings.current.resolve()
    extra = RouteBackend("ns1", "extra", "extra.example.com", servers=(A,))
    loop.call(haproxy.check(RouterTable(routes=(*ROUTES, extra))))
    broken = haproxylab.broken_edge()
    with pytest.raises(ConfigRejected, match=r"ns1:broken\.pem"):
        loop.call(haproxy.check(RouterTable(routes=(*ROUTES, broken))))
    assert haproxy.counters.reloads == 0 and settings.current.resolve() == live
    assert sorted(p.name for p in settings.run_dir.glob("gen-*")) == [live.name]
    assert get(lab, "extra.example.com") == ["503"]
    # before start, too (a router checking its first table)
    fresh = HAProxyRouter(dataclasses.replace(settings, run_dir=lab.work / "fresh"))
    with pytest.raises(ConfigRejected):
        loop.call(fresh.check(RouterTable(routes=(broken,))))


def test_runtime_state_survives_a_reload(lab: Lab, router: tuple[LoopThread, HAProxyRouter]):
    loop, haproxy = router
    target = "be_http:ns1:web/ept:127.0.0.31:8080"

    async def admin_state() -> int:
        worker = haproxy.master.worker
        assert worker is not None
        text = await haproxy.master.cli.to_worker(worker, "show servers state be_http:ns1:web")
        rows = [line.split() for line in text.splitlines()[2:] if line.strip()]
        return next(int(r[6]) for r in rows if f"{r[1]}/{r[3]}" == target)

    # an operator drains the server by hand; the next worker keeps it draining
    worker = haproxy.master.worker
    assert worker is not None
    loop.call(haproxy.master.cli.to_worker(worker, f"set server {target} state drain"))
    assert loop.call(admin_state()) & 0x08  # SRV_ADMF_FDRAIN
    extra = RouteBackend("ns1", "extra", "extra.example.com", servers=(A,))
    assert apply(loop, haproxy, RouterTable(routes=(*ROUTES, extra))).reloads == 1
    assert haproxy.master.worker != worker
    assert loop.call(admin_state()) & 0x08
