"""The cluster DNS in a real node namespace, asked from pod namespaces with dig and with
glibc (``getent`` through the pod's own resolv.conf), forwarding to a resolver on the
underlay's external host; and the attacks: another node's pod and the external host
asking this node's DNS get nothing.

One lab for the module: an underlay, the external host (198.51.100.100, running a fake
upstream resolver), two nodes set up by the linux data plane, a pod on each. The DNS
runs in node 1's namespace on its gateway 10.128.0.1, port 53, bound to br0, as the
agent runs it (``podnet.testing.dnsrunner``), fed objects through its stdin.
Everything is removed by exact name or PID, also when a test fails.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import pytest

from podnet import netns
from podnet.cluster.podresolv import remove_resolv_conf, write_resolv_conf
from podnet.cni.dnsconfig import cluster_dns, resolv_conf
from podnet.testing.dns import endpoint_slice, pod, service
from podnet.testing.lab import EXTERNAL_IP, Lab, ip, unique_run, up

pytestmark = [pytest.mark.root]

GATEWAY = "10.128.0.1"
WEB = "web.default.svc.cluster.local"
OBJECTS = {
    "services": [
        service("default", "web", "172.30.0.10", [("http", 80, "TCP")]),
        service("other", "db", "172.30.5.5", [("pg", 5432, "TCP")]),
        service("default", "hl", None, [("http", 80, "TCP")]),
        service("default", "big", None),
        service("default", "alias", type="ExternalName", externalName=WEB),
        service("default", "out", type="ExternalName", externalName="www.example.com"),
    ],
    "endpointslices": [
        endpoint_slice(
            "default", "hl-1", "hl", [("10.128.0.10", "pet-0", True), ("10.128.2.10", None, True)]
        ),
        endpoint_slice(
            "default", "big-1", "big", [(f"10.129.0.{i}", None, True) for i in range(1, 61)]
        ),
    ],
    "pods": [pod("default", "a", "10.128.0.10")],
}


@dataclass
class Env:
    lab: Lab
    pod_a: str  # on node 1 (the DNS's node)
    pod_b: str  # on node 2
    dns: subprocess.Popen[str]

    def send(self, event: dict[str, Any]) -> None:
        """Feed one watch event to the DNS and wait until it is applied."""
        assert self.dns.stdin is not None and self.dns.stdout is not None
        self.dns.stdin.write(json.dumps(event) + "\n")
        self.dns.stdin.flush()
        assert self.dns.stdout.readline().startswith("applied")


def started(ns: str, argv: list[str], expect: str) -> subprocess.Popen[str]:
    """A runner in ``ns``, once it printed its readiness line."""
    process = subprocess.Popen(
        netns.command(ns, [sys.executable, "-m", "podnet.testing.dnsrunner", *argv]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = _readline(process.stdout)
    if not line.startswith(expect):
        process.kill()
        raise AssertionError(f"{argv[0]} did not start: {line!r}")
    return process


def _readline(stream: IO[str] | None) -> str:
    assert stream is not None
    return stream.readline()


async def wire(lab: Lab) -> tuple[str, str]:
    planes = await up(lab, [1, 2])
    pods = []
    for node, tag in ((1, "a"), (2, "b")):
        ns, network = lab.pod(node, 10, tag)
        await planes[node].attach_pod(network)
        pods.append(ns)
    return pods[0], pods[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("dns")
    lab = Lab(unique_run("pdns"))
    processes: list[subprocess.Popen[str]] = []
    pods: list[str] = []
    try:
        lab.build(2)
        pod_a, pod_b = asyncio.run(wire(lab))
        pods = [pod_a, pod_b]
        for ns in pods:
            write_resolv_conf(ns, resolv_conf(cluster_dns(GATEWAY, "default")))
        records = ["--record", "www.example.com=198.51.100.7"]
        upstream = ["upstream", "--address", str(EXTERNAL_IP), *records]
        processes.append(started(f"{lab.run}-ext", upstream, "ready"))
        (tmp / "resolv.conf").write_text(f"nameserver {EXTERNAL_IP}\n")
        (tmp / "objects.json").write_text(json.dumps(OBJECTS))
        serve = ["serve", "--subnet", "10.128.0.0/23", "--objects", str(tmp / "objects.json")]
        serve += ["--upstream-resolv-conf", str(tmp / "resolv.conf")]
        processes.append(started(lab.node_ns(1), serve, "bound 53"))
        yield Env(lab, pod_a, pod_b, processes[-1])
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=10)
        for ns in pods:
            remove_resolv_conf(ns)
        asyncio.run(lab.close())


def dig(ns: str, *args: str, server: str = GATEWAY, port: int = 53) -> str:
    """dig's output from namespace ``ns`` (one try, 2 s)."""
    argv = ["dig", "+tries=1", "+time=2", "-p", str(port), f"@{server}", *args]
    done = netns.run(ns, argv, timeout=20)
    return done.stdout


def short(ns: str, *args: str) -> list[str]:
    return sorted(dig(ns, "+short", *args).split("\n"))[1:]  # first: the empty line


def status(ns: str, *args: str) -> str:
    out = dig(ns, *args)
    return out.split("status: ", 1)[1].split(",", 1)[0] if "status: " in out else out


def getent(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    """glibc through the pod's resolv.conf (``ip netns exec`` bind-mounts it)."""
    argv = ["ip", "netns", "exec", ns, "getent", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_records_with_dig(env: Env) -> None:
    a = env.pod_a
    assert short(a, WEB) == ["172.30.0.10"]
    assert short(a, "SRV", f"_http._tcp.{WEB}") == [f"0 100 80 {WEB}."]
    assert short(a, "hl.default.svc.cluster.local") == ["10.128.0.10", "10.128.2.10"]
    assert short(a, "pet-0.hl.default.svc.cluster.local") == ["10.128.0.10"]
    assert short(a, "alias.default.svc.cluster.local") == ["172.30.0.10", f"{WEB}."]
    assert short(a, "-x", "172.30.0.10") == [f"{WEB}."]
    assert short(a, "-x", "10.128.2.10") == ["10-128-2-10.hl.default.svc.cluster.local."]
    assert short(a, "TXT", "dns-version.cluster.local") == ['"1.1.0"']
    assert short(a, "10-128-0-10.default.pod.cluster.local") == ["10.128.0.10"]
    assert short(a, "+tcp", WEB) == ["172.30.0.10"]


def test_nxdomain_nodata_and_truncation(env: Env) -> None:
    a = env.pod_a
    assert status(a, "nope.default.svc.cluster.local") == "NXDOMAIN"
    nodata = dig(a, "AAAA", WEB)
    assert "status: NOERROR" in nodata and "ANSWER: 0" in nodata and "SOA" in nodata
    truncated = dig(a, "+noedns", "+ignore", "big.default.svc.cluster.local")
    assert " tc " in truncated.split("flags:", 1)[1].split(";", 1)[0] + " "
    assert len(short(a, "+noedns", "big.default.svc.cluster.local")) == 60  # retried on TCP


def test_out_of_zone_names_are_forwarded_to_the_external_host(env: Env) -> None:
    a = env.pod_a
    assert short(a, "www.example.com") == ["198.51.100.7"]
    assert short(a, "out.default.svc.cluster.local") == ["198.51.100.7", "www.example.com."]
    assert status(a, "nothing.example.com") == "NXDOMAIN"


def test_glibc_resolves_through_the_pod_resolv_conf(env: Env) -> None:
    a = env.pod_a
    for name, address in (
        ("web", "172.30.0.10"),  # short name: the pod's namespace first
        ("db.other", "172.30.5.5"),  # another namespace's service
        (WEB, "172.30.0.10"),
        ("out.default.svc.cluster.local", "198.51.100.7"),  # ExternalName, glibc follows
        ("www.example.com", "198.51.100.7"),  # through 3 local NXDOMAINs, then upstream
    ):
        done = getent(a, "ahostsv4", name)
        assert done.returncode == 0 and done.stdout.split()[0] == address, (name, done)
    reverse = getent(a, "hosts", "172.30.0.10")
    assert reverse.returncode == 0 and WEB in reverse.stdout
    assert getent(a, "hosts", "nope").returncode == 2  # not found


def test_an_update_is_answered(env: Env) -> None:
    a = env.pod_a
    name = "late.default.svc.cluster.local"
    assert status(a, name) == "NXDOMAIN"
    env.send(
        {"type": "ADDED", "kind": "services", "object": service("default", "late", "172.30.0.44")}
    )
    assert short(a, name) == ["172.30.0.44"]
    env.send({"type": "DELETED", "kind": "services", "object": service("default", "late")})
    assert status(a, name) == "NXDOMAIN"


GARBAGE = """
import os, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(2000):
    s.sendto(os.urandom(i % 600), ("10.128.0.1", 53))
for i in range(20):
    c = socket.create_connection(("10.128.0.1", 53), timeout=2)
    c.sendall(os.urandom(3000)); c.close()
"""


def test_random_bytes_from_a_pod_do_not_stop_it(env: Env) -> None:
    done = netns.run(env.pod_a, [sys.executable, "-c", GARBAGE], timeout=60)
    assert done.returncode == 0, done.stderr
    assert env.dns.poll() is None
    # The flood used up pod a's per-source rate (its meter refills over a second or two):
    # the next query retries, as a resolver does, and is answered.
    assert short(env.pod_a, "+tries=4", WEB) == ["172.30.0.10"]
    assert short(env.pod_a, "+tcp", WEB) == ["172.30.0.10"]


def answered(out: str) -> bool:
    return "ANSWER SECTION" in out or "status:" in out


@pytest.fixture
def unguarded(env: Env) -> Iterator[int]:
    """A second server in node 1 on a high port, without the device binding and the
    source check (the attacks' counterfactual)."""
    serve = ["serve", "--subnet", "10.128.0.0/23", "--port", "5353", "--unguarded"]
    process = started(env.lab.node_ns(1), serve, "bound 5353")
    try:
        yield 5353
    finally:
        process.kill()
        process.wait(timeout=10)


def test_another_nodes_pod_gets_no_answer(env: Env, unguarded: int) -> None:
    b = env.pod_b
    assert answered(dig(b, "dns-version.cluster.local", "TXT", port=unguarded))  # reachable
    for transport in ("+notcp", "+tcp"):  # but the guarded DNS does not answer it
        out = dig(b, transport, WEB)
        assert not answered(out), out
    assert answered(dig(env.pod_a, "dns-version.cluster.local", "TXT", port=unguarded))


def test_the_external_host_gets_no_answer(env: Env, unguarded: int) -> None:
    ext = f"{env.lab.run}-ext"
    ip(ext, f"route replace 10.128.0.0/23 via {env.lab.node_ip(1)}")
    try:
        assert answered(dig(ext, "dns-version.cluster.local", "TXT", port=unguarded))
        for server in (GATEWAY, str(env.lab.node_ip(1))):
            for transport in ("+notcp", "+tcp"):
                out = dig(ext, transport, WEB, server=server)
                assert not answered(out), out
    finally:
        ip(ext, "route del 10.128.0.0/23")
