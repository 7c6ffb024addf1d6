"""The router end to end: a real local cluster (multitenant) started with ``--router``,
real HAProxy in the router pod ``default/router``, and real clients on the external host
(curl, ``openssl s_client``, a Python load loop) reaching route hosts by name under
``*.apps.podnet.test`` through node1's hostPorts 80 and 443.

Issue 12's acceptance: HTTP host and path routing (longest path first, host
case-insensitive, unknown host 503); edge with the route's certificate and the three
insecure policies; re-encrypt verified against the destination CA (a wrong CA: 503);
passthrough showing the pod's own certificate; a 3:1 weight split; routes into isolated
projects served while those projects still cannot reach each other; a scale-up and
scale-down showing in routing; bad input refused (422) or not admitted while the rest
is served. Plus the attacks on what the cluster adds: the apps resolver and the router's
metrics are not reachable from elsewhere, only 80 and 443 are forwarded, and other pods
cannot read the router's credentials.

One cluster for the module, torn down in a finalizer even when a test fails; the teardown
checks that the router's processes and namespace are gone.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dnslib import DNSRecord

from podnet import netns
from podnet.client import StatusError
from podnet.cluster import lifecycle, pods
from podnet.cluster.router import router_paths
from podnet.cluster.routerprocs import pids_in_netns
from podnet.model.kinds import ROUTE, SERVICE
from podnet.testing import routerclient as rc
from podnet.testing.e2e import TEST_DATAPLANE, cluster_down_with_logs, load_state, wait_for
from podnet.testing.routecerts import RouteCa

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(900)]

DOMAIN = "apps.podnet.test"
ROUTER = "192.168.100.11"  # node1 on the default underlay
CONNECT = (
    "import socket,sys\n"
    "s=socket.socket(); s.settimeout(3)\n"
    "try:\n    s.connect((sys.argv[1], int(sys.argv[2])))\n"
    "except OSError as e:\n    print(type(e).__name__)\n"
    "else:\n    print('connected')\n"
)


def host(name: str) -> str:
    return f"{name}.{DOMAIN}"


@dataclass(frozen=True)
class World:
    """The cluster and what the tests share: its state dir, the CAs and their files."""

    state_dir: Path
    certs: Path
    route_ca: RouteCa
    pod_ca: RouteCa
    other_ca: RouteCa

    def ca_file(self, ca: RouteCa) -> Path:
        """The CA's certificate as a file for curl."""
        path = self.certs / f"ca-{ca.certificate.serial_number:x}.pem"
        if not path.exists():
            path.write_text(ca.pem)
        return path

    def route_tls(self, name: str, termination: str, policy: str = "None") -> dict[str, str]:
        """Edge or reencrypt TLS with a certificate for the route's host from the route CA."""
        leaf = self.route_ca.issue(host(name))
        tls = {"termination": termination, "certificate": leaf.certificate, "key": leaf.key}
        return {**tls, "insecureEdgeTerminationPolicy": policy}

    def curl(self, url: str, *options: str, ca: RouteCa | None = None) -> rc.Answer:
        cacert = self.ca_file(ca) if ca is not None else None
        return rc.curl(load_state(self.state_dir), url, *options, cacert=cacert)


# Per project, the apps: each one pod <app>-1 (httpecho) behind a Service <app>.
SERVICES = {"web": ("www", "api", "apiv1", "wa", "wb", "scale"), "shop": ("shop",)}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    state_dir = tmp_path_factory.mktemp("pn-router")
    certs = tmp_path_factory.mktemp("router-certs")
    spec = lifecycle.ClusterSpec(
        nodes=2, plugin="multitenant", router=True, dataplane=TEST_DATAPLANE
    )
    try:
        lifecycle.cluster_up(state_dir, spec, say=print)
        cas = (RouteCa.new("route-ca"), RouteCa.new("pod-ca"), RouteCa.new("other-ca"))
        world = World(state_dir, certs, *cas)
        _populate(world)
        yield world
    finally:
        before = load_state(state_dir) if (state_dir / "state.json").exists() else None
        router_pod = before.pods.get(before.router.pod) if before and before.router else None
        inside = pids_in_netns(router_pod.netns) if router_pod else []
        state = cluster_down_with_logs(state_dir)
        assert not [pid for pid in inside if Path(f"/proc/{pid}").exists()], inside
        if state is not None and state.router is not None:
            router_pod = state.pods[state.router.pod]
            assert not netns.exists(router_pod.netns)
            assert router_pod.process is None or not router_pod.process.alive()
            assert state.router.dns is None or not state.router.dns.alive()


def _populate(world: World) -> None:
    state_dir = world.state_dir
    for namespace, apps in SERVICES.items():
        for index, app in enumerate(apps):
            node = f"node{1 + index % 2}"
            rc.backend_pod(state_dir, f"{app}-1", namespace, {"app": app}, node)
    tls = rc.issue_files(
        world.pod_ca,
        ["secure.web.svc", "secure.web.svc.cluster.local", host("pass")],
        world.certs,
        "pod",
    )
    rc.backend_pod(state_dir, "secure-1", "web", {"app": "secure"}, "node2", tls=tls)
    with pods.admin_api(state_dir) as api:
        for namespace, apps in SERVICES.items():
            for app in apps:
                api.create(SERVICE, rc.service(app, {"app": app}), namespace=namespace)
        api.create(SERVICE, rc.service("secure", {"app": "secure"}, tls=True), namespace="web")
        for namespace, obj in _routes(world):
            api.create(ROUTE, obj, namespace=namespace)
    for name, want in (("scale", "scale-1"), ("pass", "secure-1"), ("re", "secure-1")):
        scheme = "http" if name == "scale" else "https"
        wait_served(world, f"{scheme}://{host(name)}/", want)


def wait_served(world: World, url: str, pod: str) -> None:
    """Until ``pod`` answers ``url`` through the router."""
    wait_for(lambda: world.curl(url, "-k").pod == pod, 60, f"{url} served by {pod}")


def _routes(world: World) -> list[tuple[str, dict[str, object]]]:
    reencrypt = {**world.route_tls("re", "reencrypt"), "destinationCACertificate": world.pod_ca.pem}
    wrong = {
        **world.route_tls("re-bad", "reencrypt"),
        "destinationCACertificate": world.other_ca.pem,
    }
    passthrough = {"termination": "passthrough"}
    return [
        ("web", rc.route("www", host("www"), "www")),
        ("web", rc.route("api", host("www"), "api", path="/api")),
        ("web", rc.route("apiv1", host("www"), "apiv1", path="/api/v1")),
        (
            "web",
            rc.route(
                "edge-r", host("edge-r"), "www", tls=world.route_tls("edge-r", "edge", "Redirect")
            ),
        ),
        (
            "web",
            rc.route(
                "edge-a", host("edge-a"), "www", tls=world.route_tls("edge-a", "edge", "Allow")
            ),
        ),
        ("web", rc.route("edge-n", host("edge-n"), "www", tls=world.route_tls("edge-n", "edge"))),
        ("web", rc.route("re", host("re"), "secure", tls=reencrypt, port="https")),
        ("web", rc.route("re-bad", host("re-bad"), "secure", tls=wrong, port="https")),
        ("web", rc.route("pass", host("pass"), "secure", tls=passthrough, port="https")),
        ("web", rc.route("split", host("split"), "wa", alternates=[("wb", 1)], weight=3)),
        ("web", rc.route("scale", host("scale"), "scale")),
        ("shop", rc.route("shop", host("shop"), "shop")),
    ]


def test_http_routes_by_host_and_longest_path(world: World) -> None:
    assert world.curl(f"http://{host('www')}/").pod == "www-1"
    assert world.curl(f"http://{host('www')}/apiary").pod == "www-1"
    assert world.curl(f"http://{host('www')}/api").pod == "api-1"
    assert world.curl(f"http://{host('www')}/api/x").pod == "api-1"
    assert world.curl(f"http://{host('www')}/api/v1/things").pod == "apiv1-1"
    upper = world.curl(f"http://{host('www')}/api/v1", "-H", f"Host: {host('www').upper()}")
    assert upper.pod == "apiv1-1"
    assert world.curl(f"http://{host('nothing')}/").code == 503
    headers = world.curl(f"http://{host('www')}/").echoed["headers"]
    assert headers["x-forwarded-for"].split(",")[0].strip() == "192.168.100.250"
    assert headers["x-forwarded-proto"] == "http"
    assert headers["x-forwarded-host"] == host("www")


def test_edge_serves_the_route_certificate_and_its_insecure_policy(world: World) -> None:
    state = load_state(world.state_dir)
    for name in ("edge-r", "edge-a", "edge-n"):
        answer = world.curl(f"https://{host(name)}/x", ca=world.route_ca)
        assert (answer.code, answer.pod) == (200, "www-1"), answer
        assert answer.echoed["headers"]["x-forwarded-proto"] == "https"
        seen = rc.peer_certificate(state, ROUTER, host(name))
        assert host(name) in seen.subject and "route-ca" in seen.issuer, seen
    redirected = world.curl(f"http://{host('edge-r')}/x")
    assert redirected.code == 302
    assert redirected.location == f"https://{host('edge-r')}/x"
    allowed = world.curl(f"http://{host('edge-a')}/x")
    assert (allowed.code, allowed.pod) == (200, "www-1")
    assert world.curl(f"http://{host('edge-n')}/x").code == 503
    # An unknown name over TLS gets the router's default certificate and a 503.
    assert world.curl(f"https://{host('nothing')}/", "-k").code == 503


def test_reencrypt_verifies_the_pod_against_the_destination_ca(world: World) -> None:
    answer = world.curl(f"https://{host('re')}/", ca=world.route_ca)
    assert (answer.code, answer.pod) == (200, "secure-1"), answer
    assert answer.echoed["tls"] is True  # the pod served it over TLS
    assert answer.echoed["headers"]["x-forwarded-proto"] == "https"
    assert world.curl(f"https://{host('re-bad')}/", ca=world.route_ca).code == 503


def test_passthrough_shows_the_pods_certificate(world: World) -> None:
    seen = rc.peer_certificate(load_state(world.state_dir), ROUTER, host("pass"))
    assert "secure.web.svc" in seen.subject and "pod-ca" in seen.issuer, seen
    answer = world.curl(f"https://{host('pass')}/p", ca=world.pod_ca)
    assert (answer.code, answer.pod) == (200, "secure-1"), answer
    assert answer.echoed["tls"] is True


def test_weights_split_three_to_one(world: World) -> None:
    counts = rc.shares(load_state(world.state_dir), host("split"), 400)
    assert set(counts) == {"wa-1", "wb-1"}, counts
    assert abs(counts["wa-1"] - 300) <= 30, counts  # within 10% of the 3:1 share


def test_router_reaches_isolated_projects_which_stay_isolated(world: World) -> None:
    assert world.curl(f"http://{host('shop')}/").pod == "shop-1"
    assert world.curl(f"http://{host('www')}/").pod == "www-1"
    state = load_state(world.state_dir)
    web, shop = state.pods["web/www-1"], state.pods["shop/shop-1"]
    for source, target in ((web, shop), (shop, web)):
        argv = [sys.executable, "-c", CONNECT, target.ip, "8080"]
        tried = pods.exec_pod(world.state_dir, source.name, argv, source.namespace)
        assert tried.stdout.strip() != "connected", (source.key, target.key)
    # ... while each reaches its own project.
    own = pods.exec_pod(
        world.state_dir,
        "www-1",
        [sys.executable, "-c", CONNECT, state.pods["web/api-1"].ip, "8080"],
        "web",
    )
    assert own.stdout.strip() == "connected"


def test_scale_up_and_down_show_in_routing(world: World) -> None:
    url = f"http://{host('scale')}/"
    rc.backend_pod(world.state_dir, "scale-2", "web", {"app": "scale"}, "node2")
    state = load_state(world.state_dir)
    wait_for(lambda: rc.shares(state, host("scale"), 10).get("scale-2"), 30, "scale-2 served")
    pods.delete_pod(world.state_dir, "scale-2", "web")
    wait_for(lambda: rc.shares(state, host("scale"), 20) == {"scale-1": 20}, 30, "scale-2 gone")
    assert world.curl(url).pod == "scale-1"


def test_bad_input_is_refused_while_the_rest_is_served(world: World) -> None:
    garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    broken = {**world.route_tls("broken", "edge"), "certificate": garbage}
    with pods.admin_api(world.state_dir) as api:
        for obj in (
            rc.route("broken", host("broken"), "www", tls=broken),
            rc.route("badpath", host("badpath"), "www", path="no-slash"),
        ):
            with pytest.raises(StatusError) as refused:
                api.create(ROUTE, obj, namespace="web")
            assert refused.value.code == 422, refused.value
        api.create(ROUTE, rc.route("www-dup", host("www"), "api"), namespace="web")
        verdict = wait_for(
            lambda: rc.admitted(api.get(ROUTE, "web", "www-dup")), 30, "the duplicate's status"
        )
        assert verdict[0] == "False" and verdict[1], verdict
        kept = rc.admitted(api.get(ROUTE, "web", "www"))
        assert kept is not None and kept[0] == "True", kept
    assert world.curl(f"http://{host('www')}/").pod == "www-1"
    assert world.curl(f"http://{host('shop')}/").pod == "shop-1"
    assert world.curl(f"https://{host('edge-a')}/", ca=world.route_ca).pod == "www-1"


def test_only_the_routers_ports_are_published(world: World) -> None:
    state = load_state(world.state_dir)
    node1 = state.nodes["node1"].netns
    router_pod = state.pods[state.router.pod] if state.router else None
    assert router_pod is not None
    # The metrics port is on the router pod's loopback only: not via the node, not to pods.
    for target in (ROUTER, router_pod.ip):
        tried = rc.in_external(state, [sys.executable, "-c", CONNECT, target, "1936"])
        assert tried.stdout.strip() != "connected", target
    tried = pods.exec_pod(
        world.state_dir, "www-1", [sys.executable, "-c", CONNECT, router_pod.ip, "1936"], "web"
    )
    assert tried.stdout.strip() != "connected"
    # The apps resolver answers on the external host's loopback only, and no other names.
    assert state.external is not None
    query = DNSRecord.question(host("any")).pack()
    with netns.entered(node1):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        sock.settimeout(1)
        sock.sendto(query, (state.external.ip, 53))
        with pytest.raises(OSError):
            sock.recv(512)
    assert rc.in_external(state, ["getent", "hosts", "example.com"]).returncode != 0
    assert rc.in_external(state, ["getent", "hosts", host("any")]).stdout.split()[0] == ROUTER
    # Other pods cannot read the router's kubeconfig (the state dir is hidden from them).
    kubeconfig = router_paths(world.state_dir).kubeconfig
    read = pods.exec_pod(world.state_dir, "www-1", ["cat", str(kubeconfig)], "web")
    assert read.returncode != 0 and "token" not in read.stdout


def test_cluster_up_again_keeps_the_router(world: World) -> None:
    before = load_state(world.state_dir)
    assert before.router is not None
    pid = before.pods[before.router.pod].process
    spec = lifecycle.ClusterSpec(
        nodes=2, plugin="multitenant", router=True, dataplane=TEST_DATAPLANE
    )
    lifecycle.cluster_up(world.state_dir, spec, say=print)
    after = load_state(world.state_dir)
    assert after.router is not None
    assert after.pods[after.router.pod].process == pid
    assert pids_in_netns(after.pods[after.router.pod].netns)
    assert world.curl(f"http://{host('www')}/").pod == "www-1"


def haproxies(netns_name: str) -> set[int]:
    """The HAProxy processes (master and workers) in a network namespace."""
    found = set()
    for pid in pids_in_netns(netns_name):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "haproxy":
                found.add(pid)
        except OSError:  # it ended meanwhile
            continue
    return found


def test_a_killed_router_takes_its_haproxy_along_and_comes_back(world: World) -> None:
    """The router's command is PID 2 of its pod's PID namespace: SIGKILLed, its pod's
    init ends and the kernel ends HAProxy with it (no HAProxy is left serving with no
    router to update it), as a container's processes end with it. ``cluster up`` then
    starts the router, and a new HAProxy, again."""
    state = load_state(world.state_dir)
    assert state.router is not None
    pod = state.pods[state.router.pod]
    killed = pod.process
    assert killed is not None
    haproxy = haproxies(pod.netns)
    assert haproxy, "HAProxy runs in the router pod"
    os.kill(killed.pid, signal.SIGKILL)
    wait_for(lambda: not killed.alive(), 10, "the router gone")
    wait_for(lambda: not set(pids_in_netns(pod.netns)), 10, "its pod's processes gone")
    spec = lifecycle.ClusterSpec(nodes=2, plugin="multitenant", dataplane=TEST_DATAPLANE)
    lifecycle.cluster_up(world.state_dir, spec, say=print)  # no --router: kept as recorded
    after = load_state(world.state_dir)
    process = after.pods[pod.key].process
    assert process is not None and process.alive() and process.pid != killed.pid
    assert haproxies(pod.netns) - haproxy, "a new HAProxy runs"
    wait_served(world, f"http://{host('www')}/", "www-1")
