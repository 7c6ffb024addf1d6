"""The local cluster's router pieces without a cluster: the apps domain's answers, the
portmap call's config, the router Pod, the state record, the sandbox's volume argument,
and the httpecho test server over real loopback sockets (HTTP and HTTPS)."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from collections.abc import Iterator
from ipaddress import IPv4Address
from pathlib import Path

import pytest
from dnslib import QTYPE, RCODE, DNSRecord

from podnet.cluster import appsdns, hostports, httpecho
from podnet.cluster.podcni import PodError
from podnet.cluster.router import HOST_PORTS, router_command, router_pod_object
from podnet.cluster.sandbox import Sandbox
from podnet.cluster.state import ClusterState, PodRecord, ProcessRecord, RouterRecord
from podnet.testing.routecerts import RouteCa
from podnet.testing.routerclient import issue_files

ROUTER = IPv4Address("192.168.100.11")
DOMAIN = "apps.podnet.test"


def ask(name: str, qtype: str = "A") -> DNSRecord:
    reply = appsdns.answer(DNSRecord.question(name, qtype).pack(), DOMAIN, ROUTER)
    assert reply is not None
    return DNSRecord.parse(reply)


def test_names_under_the_apps_domain_are_the_router() -> None:
    for name in ("www.apps.podnet.test", "A.B.APPS.Podnet.Test."):
        reply = ask(name)
        assert reply.header.rcode == RCODE.NOERROR
        assert [(r.rtype, str(r.rdata)) for r in reply.rr] == [(QTYPE.A, str(ROUTER))]
        assert reply.rr[0].ttl == appsdns.TTL


def test_other_types_are_empty_and_other_names_refused() -> None:
    empty = ask("www.apps.podnet.test", "AAAA")
    assert (empty.header.rcode, empty.rr) == (RCODE.NOERROR, [])
    for name in ("example.com", "apps.podnet.test", "xapps.podnet.test", "podnet.test"):
        refused = ask(name)
        assert (refused.header.rcode, refused.rr) == (RCODE.REFUSED, []), name


def test_junk_and_answers_get_no_reply() -> None:
    assert appsdns.answer(b"\x00\x01junk", DOMAIN, ROUTER) is None
    response = DNSRecord.question("www.apps.podnet.test").reply().pack()
    assert appsdns.answer(response, DOMAIN, ROUTER) is None


CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "podnet",
    "plugins": [
        {"type": "podnet", "socketPath": "/x.sock"},
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
    ],
}


def test_portmap_gets_the_runtime_config_and_the_previous_result() -> None:
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.128.0.3/23"}]}
    config = hostports.portmap_config(CONFLIST, list(HOST_PORTS.values()), prev)
    assert config == {
        "cniVersion": "1.0.0",
        "name": "podnet",
        "type": "portmap",
        "snat": True,
        "runtimeConfig": {
            "portMappings": [
                {"hostPort": 80, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": 443, "containerPort": 443, "protocol": "tcp"},
            ]
        },
        "prevResult": prev,
    }


def test_a_chain_without_portmap_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PodError, match="no portmap plugin"):
        hostports.portmap_config({**CONFLIST, "plugins": CONFLIST["plugins"][:1]}, [], {})
    with pytest.raises(PodError, match="no portmap CNI plugin"):
        hostports.plugin_path([tmp_path])
    (tmp_path / "portmap").write_text("")
    assert hostports.plugin_path([tmp_path / "none", tmp_path]) == tmp_path / "portmap"


def test_the_router_pod_declares_its_host_ports() -> None:
    pod = PodRecord("router", "default", "node1", "pn-x-p-1", "c" * 64, labels={"app": "router"})
    obj = router_pod_object(pod, router_command())
    container = obj["spec"]["containers"][0]
    assert obj["spec"]["nodeName"] == "node1"
    assert obj["metadata"] == {"name": "router", "namespace": "default", "labels": pod.labels}
    assert container["securityContext"] == {"privileged": True}
    assert [(p["name"], p["containerPort"], p["hostPort"]) for p in container["ports"]] == [
        ("http", 80, 80),
        ("https", 443, 443),
    ]
    command = container["command"]
    assert command[2] == "podnet" and command[5] == "router"
    assert command[command.index("--kubeconfig") + 1] == "/mnt/router.kubeconfig"
    assert command[command.index("--metrics") + 1].startswith("127.0.0.1:")


def test_the_router_record_survives_the_state_file(tmp_path: Path) -> None:
    state = ClusterState(cluster_id="abc123")
    dns = ProcessRecord(42, "podnet.cluster.appsdns", 7)
    state.router = RouterRecord("default/router", "node1", "192.168.100.11", DOMAIN, dns)
    state.save(tmp_path)
    loaded = ClusterState.load(tmp_path)
    assert loaded is not None and loaded.router == state.router
    assert ClusterState.from_dict({"cluster_id": "x"}).router is None


def test_the_sandbox_passes_volumes() -> None:
    sandbox = Sandbox((Path("/hidden"),), volumes=((Path("/state/router/volume"), Path("/mnt")),))
    argv = sandbox.wrap("/run/netns/x", ["true"])
    assert argv[argv.index("--volume") + 1] == "/state/router/volume:/mnt"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, int, Path]]:
    ca = RouteCa.new("echo-ca")
    cert, key = issue_files(ca, ["localhost"], tmp_path, "echo")
    (tmp_path / "ca.pem").write_text(ca.pem)
    context = httpecho.tls_context(str(cert), str(key))
    servers = httpecho.make_servers("web-1", [0], [0], context)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    try:
        yield servers[0].server_address[1], servers[1].server_address[1], tmp_path / "ca.pem"
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_httpecho_answers_with_its_name_over_http_and_https(
    served: tuple[int, int, Path],
) -> None:
    plain, secure, ca = served
    connection = http.client.HTTPConnection("127.0.0.1", plain, timeout=5)
    for path in ("/a", "/b"):  # two requests on one kept-alive connection
        connection.request("GET", path, headers={"X-Forwarded-For": "10.0.0.9"})
        answer = connection.getresponse()
        body = json.loads(answer.read())
        assert answer.status == 200
        assert body["pod"] == "web-1" and body["path"] == path and body["tls"] is False
        assert body["headers"]["x-forwarded-for"] == "10.0.0.9"
    connection.close()
    context = ssl.create_default_context(cafile=str(ca))
    tls = http.client.HTTPSConnection("localhost", secure, timeout=5, context=context)
    tls.request("GET", "/s")
    body = json.loads(tls.getresponse().read())
    assert (body["pod"], body["path"], body["tls"]) == ("web-1", "/s", True)
    tls.close()
