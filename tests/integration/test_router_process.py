"""``podnet router`` for real (``podnet.testing.routerns``): a master on etcd, the router
with its restricted identity and a real HAProxy in a namespace the test makes, HTTP
backends and curl there too. Routes follow their endpoints, a deleted route answers 503,
metrics count requests per route, a SIGKILLed router's HAProxy is taken over, and
SIGTERM leaves no process, listener or file. Waits are on readiness signals (a log
line, an answer), never on time alone."""

from __future__ import annotations

import signal
import stat
import subprocess
from pathlib import Path

import pytest

from podnet.api.pki import Pki
from podnet.kubeconfig import write_kubeconfig
from podnet.testing.api import client_for
from podnet.testing.e2e import wait_for
from podnet.testing.routecerts import RouteCa
from podnet.testing.routerns import (
    BACKENDS,
    ROUTES,
    RouterNamespace,
    admitted,
    edge,
    route,
    sample,
    service_with_endpoints,
    set_endpoints,
)

pytestmark = [pytest.mark.root]
WWW = "www.example.com"


def test_routes_follow_endpoints_and_a_deleted_route_answers_503(
    router_lab: RouterNamespace,
) -> None:
    router_lab.start_router()
    with client_for(router_lab.master.kubeconfig) as api:
        service_with_endpoints(api, "web", ["a"])
        assert api.post(ROUTES, json=route("web", WWW)).status_code == 201
        wait_for(lambda: router_lab.served_by(WWW) == "a", 30, "route served by a")
        condition = wait_for(lambda: admitted(api, "web"), 30, "status written")
        assert condition["status"] == "True"
        assert router_lab.status_of("nowhere.example.com") == 503  # unknown host

        set_endpoints(api, "web", ["b"])
        wait_for(lambda: router_lab.served_by(WWW) == "b", 30, "endpoints changed to b")
        set_endpoints(api, "web", ["b", "c"])
        wait_for(lambda: {router_lab.served_by(WWW) for _ in range(6)} == {"b", "c"}, 30, "b and c")

        assert api.delete(f"{ROUTES}/web").status_code == 200
        wait_for(lambda: router_lab.status_of(WWW) == 503, 30, "deleted route answers 503")


def test_metrics_count_requests_per_route(router_lab: RouterNamespace) -> None:
    router_lab.start_router()
    requests, errors = "podnet_router_route_requests_total", "podnet_router_route_errors_total"
    with client_for(router_lab.master.kubeconfig) as api:
        service_with_endpoints(api, "web", ["a"])
        service_with_endpoints(api, "idle", [])
        assert api.post(ROUTES, json=route("web", WWW)).status_code == 201
        wait_for(lambda: router_lab.served_by(WWW) == "a", 30, "route served")
        # a route added once HAProxy serves is a new backend: it takes a reload (the first
        # table is HAProxy's start, which is not one)
        assert api.post(ROUTES, json=route("down", "down.example.com", "idle")).status_code == 201
        wait_for(
            lambda: sample(router_lab.metrics(), requests, "down") == 0, 30, "down in the metrics"
        )
        before = sample(router_lab.metrics(), requests, "web")
        assert before is not None
        for _ in range(5):
            assert router_lab.served_by(WWW) == "a"
        for _ in range(3):
            assert router_lab.status_of("down.example.com") == 503  # a route without endpoints
        text = router_lab.metrics()
    assert sample(text, requests, "web") == before + 5
    assert sample(text, errors, "web") == 0
    assert sample(text, requests, "down") == 3
    assert sample(text, errors, "down") == 3
    assert 'podnet_router_routes{state="admitted"} 2.0' in text
    reloads = next(line for line in text.splitlines() if line.startswith("podnet_router_reloads"))
    assert float(reloads.split()[1]) >= 1
    # the metrics listen on the loopback address only: another local address is refused
    assert router_lab.curl(f"http://{BACKENDS['a']}:1936/metrics")[0] == 0


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (an exited one waiting for its reaper, a zombie, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_killed_routers_haproxy_is_taken_over_and_sigterm_leaves_nothing(
    router_lab: RouterNamespace,
) -> None:
    router_lab.start_router()
    with client_for(router_lab.master.kubeconfig) as api:
        service_with_endpoints(api, "web", ["a"])
        leaf = RouteCa.new().issue(WWW)
        tls = edge(leaf.certificate, leaf.key)
        assert api.post(ROUTES, json=route("web", WWW, tls=tls)).status_code == 201
        wait_for(lambda: router_lab.served_by(WWW, https=True) == "a", 30, "edge route served")
        # the run dir, and every file in it that holds a key or controls HAProxy: 0700/0600
        assert stat.S_IMODE(router_lab.run_dir.stat().st_mode) == 0o700
        secret = [*router_lab.run_dir.rglob("*.pem"), *router_lab.run_dir.glob("*.sock")]
        assert len(secret) >= 4
        for path in [*secret, router_lab.run_dir / "cookie-secret"]:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
        haproxy = int((router_lab.run_dir / "haproxy.pid").read_text().split()[0])

        # SIGKILL: HAProxy goes on serving, and the next router adopts it (same master)
        assert router_lab.stop_router(signal.SIGKILL) == -signal.SIGKILL
        assert router_lab.served_by(WWW, https=True) == "a"
        router_lab.start_router()
        assert router_lab.lines is not None
        router_lab.lines.wait_for("HAProxy started with 1 routes")  # its first whole table
        assert int((router_lab.run_dir / "haproxy.pid").read_text().split()[0]) == haproxy
        set_endpoints(api, "web", ["b"])
        wait_for(
            lambda: router_lab.served_by(WWW, https=True) == "b", 30, "the new router drives it"
        )

        # a second router on the same run dir is refused and changes nothing
        other = ["--http-port", "8080", "--https-port", "8443", "--metrics", "127.0.0.1:1937"]
        second = subprocess.run(
            router_lab.router_argv(*other), capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 1 and "another podnet router" in second.stderr
        assert router_lab.served_by(WWW, https=True) == "b"

    # SIGTERM: no process left in the namespace, no file, no listener
    assert router_lab.stop_router() == 0
    assert not _running(haproxy)
    assert not router_lab.run_dir.exists()
    pids = subprocess.run(["ip", "netns", "pids", router_lab.ns], capture_output=True, text=True)
    assert pids.returncode == 0 and pids.stdout.split() == []
    assert router_lab.status_of(WWW, https=True) == 0


def test_a_router_the_api_refuses_exits_1_and_leaves_nothing(router_lab: RouterNamespace) -> None:
    """A token the API does not know: the router says so, exits 1, and no HAProxy ever
    started (nothing to serve before the first listing) nor any file stays."""
    ca = Pki.at(router_lab.master.state_dir / "pki").ca_pem()
    write_kubeconfig(router_lab.kubeconfig, router_lab.master.server, ca, "not-a-token")
    done = subprocess.run(router_lab.router_argv(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "Unauthorized" in done.stderr.strip().splitlines()[-1]
    assert not router_lab.run_dir.exists()
    pids = subprocess.run(["ip", "netns", "pids", router_lab.ns], capture_output=True, text=True)
    assert pids.returncode == 0 and pids.stdout.split() == []
