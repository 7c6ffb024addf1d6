"""The router's HAProxy under change: endpoint changes over the runtime API without a
reload, a refused config leaving the old one serving, coalesced reloads, and no failed
request while reloads happen (keep-alive, new connections, edge TLS, passthrough)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from podnet import netns
from podnet.router.haproxy import DriverCounters, HAProxyRouter
from podnet.router.table import RouteBackend, RouterTable, Server
from podnet.testing import haproxylab, tools
from podnet.testing.haproxylab import Lab, LabCA, LoopThread, apply

pytestmark = [pytest.mark.root]

A, B, C = Server("127.0.0.21", 8080), Server("127.0.0.22", 8080), Server("127.0.0.23", 8080)
POD_TLS = Server("127.0.0.24", 8443)
CA = LabCA.create("reload-ca")


def _routes() -> tuple[RouteBackend, ...]:
    web, edge = haproxylab.web_and_edge(CA, web=(A,), edge=(A, B))
    pt = RouteBackend("ns1", "pt", "pt.example.com", termination="passthrough", servers=(POD_TLS,))
    return (web, edge, pt)


ROUTES = _routes()  # made once: each certificate issued is a new one


def base_routes() -> tuple[RouteBackend, ...]:
    return ROUTES


@pytest.fixture
def lab() -> Iterator[Lab]:
    tools.require("haproxy", (2, 6))
    tools.require("curl")
    with haproxylab.lab("hxreload") as the_lab:
        for server, tag in ((A, "a"), (B, "b"), (C, "c")):
            the_lab.backend(server.ip, server.port, tag)
        the_lab.backend(POD_TLS.ip, POD_TLS.port, "pod", CA.issue("pt.example.com"))
        yield the_lab


@pytest.fixture
def router(lab: Lab) -> Iterator[tuple[LoopThread, HAProxyRouter]]:
    with haproxylab.running_router(lab, RouterTable(routes=base_routes())) as running:
        yield running


def tags(lab: Lab, host: str, count: int, *headers: str) -> Counter[str]:
    """Which backends answered ``count`` plain-HTTP requests for ``host``."""
    extra = [arg for h in headers for arg in ("-H", h)]
    urls = ["http://127.0.0.1/"] * count
    done = lab.run("curl", "-s", "-H", f"Host: {host}", *extra, *urls, timeout=60)
    assert done.returncode == 0, done.stderr
    return Counter(m.group(1) for m in re.finditer(r'"tag": "(\w+)"', done.stdout))


def status(lab: Lab, host: str) -> int:
    done = lab.run(
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        f"Host: {host}",
        "http://127.0.0.1/",
    )
    return int(done.stdout)


def with_servers(table: RouterTable, name: str, *servers: Server) -> RouterTable:
    return RouterTable(
        routes=tuple(
            dataclasses.replace(r, servers=servers) if r.name == name else r for r in table.routes
        )
    )


async def worker_states(router: HAProxyRouter) -> dict[str, str]:
    """``<backend>/<server>`` → admin state, as the current worker has them."""
    worker = router.master.worker
    assert worker is not None
    text = await router.master.cli.to_worker(worker, "show servers state")
    rows = [line.split() for line in text.splitlines()[2:] if line.strip()]
    return {f"{r[1]}/{r[3]}": r[6] for r in rows}


def server_states(loop: LoopThread, router: HAProxyRouter) -> dict[str, str]:
    return loop.call(worker_states(router))


def test_endpoint_changes_apply_without_a_reload(
    lab: Lab, router: tuple[LoopThread, HAProxyRouter]
):
    loop, haproxy = router
    table = RouterTable(routes=base_routes())
    before = haproxy.counters
    grown = with_servers(table, "web", A, C)
    after = apply(loop, haproxy, grown)
    assert after.reloads == before.reloads and after.runtime_updates == before.runtime_updates + 1
    assert tags(lab, "web.example.com", 10) == {"a": 5, "c": 5}
    live_config = (haproxy.settings.current / "haproxy.cfg").read_text()
    assert "server ept:127.0.0.23:8080 127.0.0.23:8080 weight 1" in live_config  # agrees
    # the added server has a sticky cookie of its own
    cookies = set()
    for _ in range(2):
        done = lab.run("curl", "-s", "-i", "-H", "Host: web.example.com", "http://127.0.0.1/")
        cookies.add(re.search(r"set-cookie: ([^;]+)", done.stdout, re.I).group(1))  # type: ignore[union-attr]
    assert len(cookies) == 2
    for cookie in cookies:
        assert len(tags(lab, "web.example.com", 4, f"Cookie: {cookie}")) == 1

    reweighted = with_servers(table, "web", Server(A.ip, A.port, 0), Server(C.ip, C.port, 2))
    assert apply(loop, haproxy, reweighted).reloads == before.reloads
    assert tags(lab, "web.example.com", 6) == {"c": 6}
    only_c = with_servers(table, "web", C)
    counters = apply(loop, haproxy, only_c)
    assert (
        counters.reloads == before.reloads
        and counters.runtime_updates == before.runtime_updates + 3
    )
    assert tags(lab, "web.example.com", 6) == {"c": 6}
    assert "be_http:ns1:web/ept:127.0.0.21:8080" not in server_states(loop, haproxy)

    # a reload (a route added) agrees with what the runtime API did
    extra = RouteBackend("ns1", "extra", "extra.example.com", servers=(B,))
    reloaded = apply(loop, haproxy, RouterTable(routes=(*only_c.routes, extra)))
    assert reloaded.reloads == before.reloads + 1
    assert tags(lab, "web.example.com", 6) == {"c": 6}
    assert tags(lab, "extra.example.com", 2) == {"b": 2}
    # a server removed, then back: it comes back ready (not left in maintenance)
    apply(loop, haproxy, with_servers(only_c, "web", C, A))
    assert tags(lab, "web.example.com", 6) == {"a": 3, "c": 3}
    # new weights in a reload: the config's, not the saved states' old ones
    heavier_a = with_servers(table, "web", Server(A.ip, A.port, 3), C)
    assert apply(loop, haproxy, heavier_a).reloads == before.reloads + 2
    assert tags(lab, "web.example.com", 8) == {"a": 6, "c": 2}


def test_a_refused_config_leaves_the_old_one_serving(
    lab: Lab, router: tuple[LoopThread, HAProxyRouter]
):
    loop, haproxy = router
    before = haproxy.counters
    broken = haproxylab.broken_edge(B)
    live = haproxy.settings.current.resolve()
    after = apply(loop, haproxy, RouterTable(routes=(*base_routes(), broken)))
    assert after.rejected == before.rejected + 1 and after.reloads == before.reloads
    assert "certs/ns1:broken.pem" in after.last_error
    assert "ns1:broken.pem" in (haproxy.settings.run_dir / "rejected" / "check.txt").read_text()
    assert haproxy.settings.current.resolve() == live
    assert tags(lab, "web.example.com", 2) == {"a": 2}
    assert status(lab, "broken.example.com") == 503
    # the next good table is applied
    fixed = dataclasses.replace(broken, certificate_pem=CA.issue("broken.example.com"))
    good = apply(loop, haproxy, RouterTable(routes=(*base_routes(), fixed)))
    assert good.reloads == before.reloads + 1


def test_a_burst_of_updates_is_one_reload_and_no_change_is_none(
    lab: Lab, router: tuple[LoopThread, HAProxyRouter]
):
    loop, haproxy = router
    before = haproxy.counters
    tables = [
        RouterTable(
            routes=(*base_routes(), RouteBackend("ns2", f"r{i}", f"r{i}.example.com", servers=(B,)))
        )
        for i in range(20)
    ]

    async def burst() -> DriverCounters:
        for table in tables:  # no await between them: the driver sees only the last
            haproxy.update(table)
        return await haproxy.settled()

    after = loop.call(burst())
    assert after.reloads == before.reloads + 1 and after.rejected == before.rejected
    assert tags(lab, "r19.example.com", 1) == {"b": 1}
    assert status(lab, "r3.example.com") == 503
    same = apply(loop, haproxy, tables[-1])
    assert (same.reloads, same.runtime_updates) == (after.reloads, after.runtime_updates)


def test_no_failed_request_across_reloads(lab: Lab, router: tuple[LoopThread, HAProxyRouter]):
    loop, haproxy = router
    before = haproxy.counters
    loads = {
        "http keep-alive": lab.start_load("http", 80, "web.example.com", 2, keep_alive=True),
        "http new connections": lab.start_load("http", 80, "web.example.com", 1, keep_alive=False),
        "edge TLS": lab.start_load("https", 443, "edge.example.com", 2, keep_alive=False),
        "passthrough": lab.start_load("https", 443, "pt.example.com", 1, keep_alive=False),
    }
    table = RouterTable(routes=base_routes())
    reloads = 20  # and as many runtime changes; the 20,000-request run is in bench/
    for i in range(reloads):
        extra = RouteBackend("ns2", f"extra{i}", f"extra{i}.example.com", servers=(C,))
        routed = RouterTable(routes=(*table.routes, extra))
        apply(loop, haproxy, with_servers(routed, "web", A, C))  # a reload
        apply(loop, haproxy, with_servers(routed, "web", A))  # C removed at run time
    results = {name: load.finish() for name, load in loads.items()}
    after = haproxy.counters
    assert after.reloads - before.reloads == reloads, after
    assert after.runtime_updates - before.runtime_updates == reloads, after
    for name, counts in results.items():
        assert set(counts) == {"200"}, (name, counts)
        assert counts["200"] > 0
    print(json.dumps({"reloads": reloads, **results}))


def test_a_removed_server_finishes_its_requests_then_is_deleted(
    lab: Lab, router: tuple[LoopThread, HAProxyRouter]
):
    loop, haproxy = router
    table = RouterTable(routes=base_routes())
    target = "be_http:ns1:web/ept:127.0.0.21:8080"
    release = lab.work / "release"
    argv = ["curl", "-s", "-w", "\\n%{http_code}", "-H", "Host: web.example.com"]
    in_flight = subprocess.Popen(
        netns.command(lab.ns, [*argv, f"http://127.0.0.1/hold{release}"]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        started = Path(f"{release}.started")

        async def reached_a() -> None:  # the backend marks the request's arrival
            while not started.exists():
                await asyncio.sleep(0.02)

        loop.call(reached_a(), timeout=30)
        counters = apply(loop, haproxy, with_servers(table, "web", B))
        assert counters.reloads == 0 and counters.runtime_updates == 1
        # the request in flight keeps A in the worker, in maintenance ("del server" refused)
        assert int(server_states(loop, haproxy)[target]) & 0x01
        assert tags(lab, "web.example.com", 4) == {"b": 4}  # A takes no new request
        release.touch()
        out, _ = in_flight.communicate(timeout=30)
        assert out.splitlines()[-1] == "200" and '"tag": "a"' in out  # not cut off
    finally:
        if in_flight.poll() is None:
            in_flight.kill()
            in_flight.wait(timeout=10)

    async def deleted() -> None:  # the driver's watch retries "del server" every 2 s
        while target in await worker_states(haproxy):
            await asyncio.sleep(0.1)

    loop.call(deleted(), timeout=60)
    # back again after its deletion: added anew
    apply(loop, haproxy, with_servers(table, "web", A, B))
    assert tags(lab, "web.example.com", 4) == {"a": 2, "b": 2}


def test_a_route_without_endpoints_gets_its_first_at_run_time(
    lab: Lab, router: tuple[LoopThread, HAProxyRouter]
):
    loop, haproxy = router
    empty = RouteBackend("ns1", "empty", "empty.example.com")
    table = RouterTable(routes=(*base_routes(), empty))
    assert apply(loop, haproxy, table).reloads == 1
    assert status(lab, "empty.example.com") == 503
    counters = apply(loop, haproxy, with_servers(table, "empty", B))
    assert counters.reloads == 1 and counters.runtime_updates == 1
    assert tags(lab, "empty.example.com", 2) == {"b": 2}
    # passthrough (balance source, hash-type consistent) takes runtime servers too
    second = Server("127.0.0.25", 8443)
    grown = with_servers(with_servers(table, "empty", B), "pt", POD_TLS, second)
    assert apply(loop, haproxy, grown).runtime_updates == 2
    assert "be_tcp:ns1:pt/ept:127.0.0.25:8443" in server_states(loop, haproxy)
