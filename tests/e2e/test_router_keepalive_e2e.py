"""wrk through the router with kept-alive connections (issue 19, finding 13): no error of
any class, and the client's connections are kept, not re-opened.

A 1-node local cluster with ``--router`` (real HAProxy in the router pod), an httpecho
pod serving HTTP on 8080 and HTTPS on 8443 behind a two-port Service, and the
benchmark's Routes (``routerclient.echo_routes``: http and edge). wrk runs on the
external host with 16 keep-alive connections for a few seconds, through node1's
hostPorts 80 and 443. wrk re-opens a connection only after an error or a
``Connection: close``, so the frontend that took its connections must have counted
exactly 16 of them, and wrk's probe of the address before it starts (``show stat`` over
the runtime API, before and after).

Before the fix, the Routes named no port: the router served them from both of the
Service's ports, so every other plain-HTTP request went to the pod's TLS port. HAProxy
answered the first request of a connection with 502 and, for a later one, closed the
client's connection without an answer (so that the client retries): about 1,000 read
errors, 500 non-2xx answers and 1,000 client connections in 5 s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from podnet.cluster import lifecycle, pods
from podnet.model.kinds import ROUTE, SERVICE
from podnet.testing import routerclient as rc
from podnet.testing import wrk
from podnet.testing.e2e import TEST_DATAPLANE, cluster_down_with_logs, load_state, wait_for
from podnet.testing.routecerts import RouteCa

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

DOMAIN = "apps.podnet.test"
CONNECTIONS = 16
PROBES = 1  # wrk connects once to each address the host resolves to before it starts
SECONDS = 3


def host(name: str) -> str:
    return f"{name}.{DOMAIN}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state_dir = tmp_path_factory.mktemp("pn-rka")
    certs = tmp_path_factory.mktemp("rka-certs")
    spec = lifecycle.ClusterSpec(nodes=1, plugin="subnet", router=True, dataplane=TEST_DATAPLANE)
    try:
        lifecycle.cluster_up(state_dir, spec, say=print)
        tls = rc.issue_files(RouteCa.new("pod-ca"), ["web.default.svc"], certs, "pod")
        rc.backend_pod(state_dir, "web-1", "default", {"app": "web"}, "node1", tls=tls)
        with pods.admin_api(state_dir) as api:
            api.create(SERVICE, rc.service("web", {"app": "web"}, tls=True), namespace="default")
            for route in rc.echo_routes("web", host("web"), host("edge")):
                api.create(ROUTE, route, namespace="default")
        state = load_state(state_dir)
        for url in (f"http://{host('web')}/", f"https://{host('edge')}/"):
            wait_for(lambda u=url: rc.curl(state, u, "-k").code == 200, 60, f"{url} served")
        yield state_dir
    finally:
        cluster_down_with_logs(state_dir)


@pytest.mark.parametrize(
    ("url", "frontend"),
    [(f"http://{host('web')}/", "public"), (f"https://{host('edge')}/", "public_ssl")],
)
def test_wrk_through_the_router_has_no_errors_and_keeps_its_connections(
    cluster: Path, url: str, frontend: str
) -> None:
    before = rc.frontend_sessions(cluster)[frontend]
    argv = wrk.command(url, SECONDS, CONNECTIONS)
    done = rc.in_external(load_state(cluster), argv, timeout=SECONDS + 30)
    accepted = rc.frontend_sessions(cluster)[frontend] - before
    assert done.returncode == 0, done.stderr
    run = wrk.parse(done.stdout)
    assert run.requests > CONNECTIONS, done.stdout
    assert run.errors == dict.fromkeys(run.errors, 0), done.stdout
    assert accepted == CONNECTIONS + PROBES, f"{frontend} took {accepted}\n{done.stdout}"
