"""``podnet trace``: resolution, verdict against probe, the CLI with a fake API and fake
probes; and what it builds on: container ports of pods, the echo server's ports, probes."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import click
import httpx
import pytest
from click.testing import CliRunner, Result

from podnet.cli.main import CliState, cli
from podnet.cli.pod_cmd import parse_port
from podnet.client import NotFound
from podnet.client.sync import ApiClient
from podnet.cluster import matrix, pods
from podnet.cluster.matrix import Endpoint, Probe
from podnet.cluster.state import ClusterState, PodRecord
from podnet.kubeconfig import ClientConfig
from podnet.model.kinds import Kind
from podnet.model.network import MULTITENANT, NETWORKPOLICY, SUBNET
from podnet.policy import trace
from podnet.policy.trace import Comparison, Target, TraceError

SERVER = "https://api.test:6443"
Obj = dict[str, Any]


def pod(name: str, ns: str, ip: str, phase: str = "Running", **labels: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": "node1", "containers": [{"name": "c"}]},
        "status": {"phase": phase, "podIP": ip},
    }


def netns(name: str, netid: int) -> Obj:
    return {"metadata": {"name": name}, "netname": name, "netid": netid}


PODS = [
    pod("web", "a", "10.128.0.10", app="web"),
    pod("client", "a", "10.128.0.11", app="client"),
    pod("db", "b", "10.128.1.10", app="db"),
    pod("pending", "b", "", phase="Pending"),
]


class FakeReader:
    """The reads a trace makes, from plain lists; also served over HTTP for the CLI."""

    def __init__(self, plugin: str | None = MULTITENANT, policies: list[Obj] | None = None):
        network: Obj = {"metadata": {"name": "default"}, "pluginName": plugin}
        self.network = None if plugin is None else network
        self.lists: dict[str, list[Obj]] = {
            "pods": PODS,
            "namespaces": [{"metadata": {"name": n}} for n in ("default", "a", "b")],
            "netnamespaces": [netns("default", 0), netns("a", 10), netns("b", 11)],
            "networkpolicies": policies or [],
            "hostsubnets": [{"hostIP": "192.168.100.11"}, {"hostIP": ""}],
            "services": [],
            "egressnetworkpolicies": [],
        }

    def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any]:
        assert (kind.plural, name) == ("clusternetworks", "default")
        if self.network is None:
            raise NotFound("not found", 404, "NotFound")
        return self.network

    def list(self, kind: Kind, namespace: str | None = None) -> dict[str, Any]:
        assert namespace is None  # every namespace
        return {"items": self.lists[kind.plural]}

    def handler(self, request: httpx.Request) -> httpx.Response:
        plural = request.url.path.rstrip("/").split("/")[-1]
        if plural == "default":
            if self.network is None:
                return httpx.Response(404, json={"kind": "Status", "code": 404})
            return httpx.Response(200, json=self.network)
        return httpx.Response(200, json={"kind": "List", "items": self.lists[plural]})


# --- resolution ---------------------------------------------------------------------------


def test_resolve_pods_and_addresses() -> None:
    assert trace.resolve("a/web", PODS) == Target(IPv4Address("10.128.0.10"), "a/web")
    assert trace.resolve("8.8.8.8", PODS) == Target(IPv4Address("8.8.8.8"))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a/nope", 'pod "nope" not found in namespace "a"'),
        ("b/pending", "pod b/pending has no IPv4 address yet (phase Pending)"),
        ("10.0.0.300", "not a valid IPv4 address"),
        ("fe80::1", "only IPv4"),
        ("10.0.0.0/8", "is a network"),
        ("web", "neither namespace/name nor an IPv4 address"),
        ("a/b/c", "neither namespace/name"),
    ],
)
def test_resolve_refuses_clearly(text: str, words: str) -> None:
    with pytest.raises(TraceError, match=re.escape(words)):
        trace.resolve(text, PODS)


def test_a_pod_with_an_ip_that_is_not_running_is_refused() -> None:
    with pytest.raises(TraceError, match="not running"):
        trace.resolve("b/x", [pod("x", "b", "10.128.1.20", phase="Succeeded")])


def test_fetch_objects_reads_plugin_objects_and_host_ips() -> None:
    objects = trace.fetch_objects(FakeReader(NETWORKPOLICY))
    assert objects.plugin == NETWORKPOLICY
    assert objects.node_ips == ["192.168.100.11"]
    ruleset = objects.ruleset()
    assert [e.key for e in ruleset.endpoints] == ["a/web", "a/client", "b/db"]
    assert IPv4Address("192.168.100.11") in ruleset.host_ips


def test_plugin_defaults_to_subnet_and_a_missing_cluster_network_is_an_error() -> None:
    reader = FakeReader(MULTITENANT)
    assert reader.network is not None
    del reader.network["pluginName"]
    assert trace.cluster_plugin(reader) == SUBNET
    with pytest.raises(TraceError, match='ClusterNetwork "default" does not exist'):
        trace.cluster_plugin(FakeReader(None))


@pytest.mark.parametrize(
    ("protocol", "port", "expected"),
    [(None, None, ("ICMP", None)), (None, 80, ("TCP", 80)), ("udp", 53, ("UDP", 53))],
)
def test_packet_kind_defaults(
    protocol: str | None, port: int | None, expected: tuple[str, int | None]
) -> None:
    assert trace.packet_kind(protocol, port) == expected


def test_probe_problems() -> None:
    assert "CONFIG_IP_SCTP" in (trace.probe_problem("SCTP", 80) or "")
    assert "needs --port" in (trace.probe_problem("TCP", None) or "")
    assert trace.probe_problem("UDP", 53) is None and trace.probe_problem("ICMP", None) is None
    with pytest.raises(TraceError, match="--port applies"):
        trace.packet_kind("icmp", 80)


# --- verdict against probe ----------------------------------------------------------------


def test_comparison_lines() -> None:
    assert trace.compare(True, Probe(True, 1.0)).line() == "probe: connected (data plane agrees)"
    assert trace.compare(False, Probe(False, error="x")).line() == (
        "probe: no answer (data plane agrees)"
    )
    leak = trace.compare(False, Probe(True, 1.0))
    assert not leak.agrees and leak.line().startswith("DISAGREEMENT: the rules say DENIED")
    lost = trace.compare(True, Probe(False, error="timed out"))
    assert lost.line() == (
        "DISAGREEMENT: the rules say ALLOWED but the probe got no answer (timed out): "
        "a data plane bug"
    )


def test_probed_matrix_marks_disagreements() -> None:
    names = ["a/x", "a/y"]
    allowed = {("a/x", "a/x"): True, ("a/x", "a/y"): True, ("a/y", "a/x"): False}
    allowed[("a/y", "a/y")] = True
    probed = {
        ("a/x", "a/y"): Comparison(True, True),
        ("a/y", "a/x"): Comparison(False, True),
    }
    lines = trace.render_probed_matrix(names, allowed, probed).splitlines()
    assert lines[1].split() == ["a/x", "✓", "✓"]
    assert lines[2].split() == ["a/y", "✗!", "✓"]
    assert lines[4].startswith("a/y -> a/x: DISAGREEMENT")
    assert lines[-1] == "probed 2 pairs: 1 agree, 1 disagree"


# --- the CLI ------------------------------------------------------------------------------


@pytest.fixture
def reader() -> FakeReader:
    return FakeReader(MULTITENANT)


def run(reader: FakeReader, *args: str) -> Result:
    def factory(config: ClientConfig, *, log: Callable[[str], None] | None = None) -> ApiClient:
        return ApiClient(config, transport=httpx.MockTransport(reader.handler), log=log)

    state = CliState(make_client=factory, load_config=lambda _path: ClientConfig(SERVER))
    return CliRunner().invoke(cli, ["trace", *args], obj=state)


def error_line(result: Result) -> str:
    assert result.exit_code == 1, result.output
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.output
    return result.stderr


def test_cli_prints_the_verdict(reader: FakeReader) -> None:
    result = run(reader, "a/client", "b/db", "--port", "8080")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("DENIED: pod a/client (10.128.0.11 on node1) -> pod b/db")
    assert "VNIDs: source 10, destination 11" in result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("a/nope", "b/db"), "not found"),
        (("a/web", "999.1.1.1"), "not a valid IPv4"),
        (("a/web", "b/db", "--port", "70000"), "--port"),
        (("a/web", "b/db", "--protocol", "gre"), "--protocol"),
        (("a/web",), "SRC and DST"),
        (("--matrix", "a/web"), "no SRC or DST"),
        (("a/web", "b/db", "-n", "a"), "--matrix only"),
        (("a/web", "b/db", "--protocol", "icmp", "--port", "1"), "--port applies"),
    ],
)
def test_cli_errors(reader: FakeReader, args: tuple[str, ...], words: str) -> None:
    assert words in error_line(run(reader, *args))


def test_cli_matrix(reader: FakeReader) -> None:
    result = run(reader, "--matrix", "-n", "a", "--port", "8080")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["a/client", "✓", "✓"]
    assert lines[-1].startswith("✓ allowed, ✗ denied: tcp/8080, mode multitenant")


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Path:
    """A recorded local cluster holding a/web, a/client and b/db (no processes)."""
    state = ClusterState(plugin="multitenant", cluster_id="t1")
    for p in PODS[:3]:
        meta = p["metadata"]
        record = PodRecord(meta["name"], meta["namespace"], "node1", f"pn-t1-p-{meta['name']}", "c")
        record.ip = p["status"]["podIP"]
        state.pods[record.key] = record
    state.save(tmp_path)
    return tmp_path


ProbeCall = tuple[str, str, str, int | None]


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[ProbeCall]:
    """Replace the real probe: everything connects; records (source, dst, proto, port)."""
    calls: list[ProbeCall] = []

    def fake(
        source: Endpoint, dst_ip: str, protocol: str = "ICMP", port: int | None = None
    ) -> Probe:
        calls.append((source.name, dst_ip, protocol, port))
        return Probe(True, 0.1)

    monkeypatch.setattr(matrix, "probe", fake)
    return calls


def test_probe_that_agrees(reader: FakeReader, cluster_dir: Path, probes: list[ProbeCall]) -> None:
    result = run(
        reader, "a/client", "a/web", "--port", "8080", "--probe", "--state-dir", str(cluster_dir)
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ALLOWED:")
    assert result.stdout.splitlines()[-1] == "probe: connected (data plane agrees)"
    assert probes == [("a/client", "10.128.0.10", "TCP", 8080)]


def test_probe_that_disagrees_exits_3(
    reader: FakeReader, cluster_dir: Path, probes: list[ProbeCall]
) -> None:
    result = run(reader, "10.128.0.11", "b/db", "--probe", "--state-dir", str(cluster_dir))
    assert result.exit_code == 3, result.output
    assert result.stdout.splitlines()[-1].startswith("DISAGREEMENT: the rules say DENIED")
    assert probes == [("a/client", "10.128.1.10", "ICMP", None)]  # no port: ping


def test_probe_errors_send_nothing(
    reader: FakeReader, cluster_dir: Path, tmp_path: Path, probes: list[ProbeCall]
) -> None:
    flag = ("--probe", "--state-dir", str(cluster_dir))
    assert "CONFIG_IP_SCTP" in error_line(
        run(reader, "a/web", "b/db", "--protocol", "sctp", "--port", "9", *flag)
    )
    assert "needs --port" in error_line(run(reader, "a/web", "b/db", "--protocol", "udp", *flag))
    assert "not a pod of the local cluster" in error_line(run(reader, "8.8.8.8", "b/db", *flag))
    none = ("--probe", "--state-dir", str(tmp_path / "none"))
    assert "needs the local cluster" in error_line(run(reader, "a/web", "b/db", *none))
    assert probes == []


def test_probed_matrix_flags_disagreements(
    reader: FakeReader, cluster_dir: Path, probes: list[ProbeCall]
) -> None:
    result = run(reader, "--matrix", "--port", "8080", "--probe", "--state-dir", str(cluster_dir))
    assert result.exit_code == 3, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[-3:] == ["a/client", "a/web", "b/db"]
    assert lines[1].split() == ["a/client", "✓", "✓", "✗!"]
    assert "probed 6 pairs: 2 agree, 4 disagree" in result.stdout
    assert len(probes) == 6 and all(call[2:] == ("TCP", 8080) for call in probes)


# --- container ports: `podnet pod run --port` and the Pod object ---------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8080", (None, 8080, "TCP")),
        ("http=80", ("http", 80, "TCP")),
        ("dns=53/udp", ("dns", 53, "UDP")),
        ("9000/SCTP", (None, 9000, "SCTP")),
    ],
)
def test_parse_port(text: str, expected: pods.ContainerPort) -> None:
    assert parse_port(text) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("http", "expected [NAME=]PORT[/PROTO]"),
        ("=80", "expected"),
        ("80/", "expected"),
        ("0", "not in 1..65535"),
        ("70000", "not in 1..65535"),
        ("80/icmp", "not TCP, UDP or SCTP"),
        ("Web_1=80", "port name"),
        ("a-very-long-port-name=80", "1 to 15 characters"),
    ],
)
def test_parse_port_refuses(text: str, words: str) -> None:
    with pytest.raises(click.BadParameter, match=re.escape(words)):
        parse_port(text)


def test_pod_run_passes_ports_and_refuses_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    privileges: list[bool] = []

    def fake_run_pod(
        *args: Any, privileged: bool = False, readiness: Any = None, **_: Any
    ) -> PodRecord:
        seen.append(args)
        privileges.append(privileged)
        return PodRecord(args[1], args[2], "node1", "pn-x-p-web", "c", ip="10.128.0.5")

    monkeypatch.setattr(pods, "run_pod", fake_run_pod)
    runner = CliRunner()
    ok = runner.invoke(cli, ["pod", "run", "web", "-p", "http=8080", "--port", "53/udp"])
    assert ok.exit_code == 0, ok.output
    assert seen[0][-1] == [("http", 8080, "TCP"), (None, 53, "UDP")]
    assert seen[0][-2] == pods.ECHO_COMMAND
    again = runner.invoke(cli, ["pod", "run", "web", "-p", "80", "-p", "x=80/tcp"])
    assert again.exit_code == 1 and "port 80/TCP is given twice" in again.stderr
    named = runner.invoke(cli, ["pod", "run", "web", "-p", "x=80", "-p", "x=81"])
    assert named.exit_code == 1 and "port name 'x' is used twice" in named.stderr
    assert len(seen) == 1
    assert runner.invoke(cli, ["pod", "run", "--privileged", "root"]).exit_code == 0
    assert privileges == [False, True], "unprivileged unless asked"


def test_pod_object_and_echo_command_follow_the_ports() -> None:
    record = PodRecord("web", "a", "node1", "pn-x-p-web", "c", labels={"app": "web"})
    ports: list[pods.ContainerPort] = [("http", 8080, "TCP"), (None, 53, "udp"), ("s", 9, "SCTP")]
    command = pods.echo_command(ports)
    assert command == (*pods.ECHO_COMMAND, "--port", "8080", "--port", "53")
    container = pods.pod_object(record, command, ports)["spec"]["containers"][0]
    assert container["ports"] == [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
        {"containerPort": 53, "protocol": "UDP"},
        {"name": "s", "containerPort": 9, "protocol": "SCTP"},
    ]
    assert "ports" not in pods.pod_object(record, pods.ECHO_COMMAND)["spec"]["containers"][0]
    assert pods.echo_command([]) == pods.ECHO_COMMAND
    assert pods.echo_ports([(None, 9, "SCTP")]) == [pods.ECHO_PORT]


# --- the echo server on several ports and the UDP probe (loopback only) -------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def echo_ports() -> Iterator[list[int]]:
    """The echo server on two loopback ports, stopped by PID."""
    ports = [free_port(), free_port()]
    argv = [sys.executable, "-m", "podnet.cluster.echo", "--bind", "127.0.0.1"]
    argv += [arg for port in ports for arg in ("--port", str(port))]
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        for _ in ports:  # one line per port once it serves
            assert "serving tcp+udp" in server.stdout.readline()
        yield ports
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
def in_root_netns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probes enter the source pod's namespace; here they stay where they are."""
    monkeypatch.setattr(matrix.netns, "entered", lambda _name: nullcontext())


SOURCE = Endpoint("a/client", "node1", "127.0.0.1", "pn-x-p-client")


def test_echo_serves_tcp_and_udp_on_each_port(echo_ports: list[int], in_root_netns: None) -> None:
    for port in echo_ports:
        assert matrix.probe(SOURCE, "127.0.0.1", "tcp", port).ok
        udp = matrix.probe(SOURCE, "127.0.0.1", "udp", port)
        assert udp.ok and udp.ms is not None, udp


def test_udp_probe_to_a_closed_port_fails(in_root_netns: None) -> None:
    result = matrix.udp_probe(SOURCE, "127.0.0.1", free_port(), attempts=2)
    assert not result.ok and result.error == "Connection refused"


def test_probe_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix, "ping_probe", lambda source, ip: Probe(True, 0.5))
    assert matrix.probe(SOURCE, "10.128.0.2") == Probe(True, 0.5)
    with pytest.raises(matrix.ProbeUnsupported, match="CONFIG_IP_SCTP"):
        matrix.probe(SOURCE, "10.128.0.2", "sctp", 80)
    with pytest.raises(matrix.ProbeUnsupported, match="needs a port"):
        matrix.probe(SOURCE, "10.128.0.2", "udp")
