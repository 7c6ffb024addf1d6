"""``podnet trace --ofproto`` on fakes: the deciding flows of a recorded ``ofproto/trace``,
pods read from ports' external_ids, OVS's verdict against podnet's (DISAGREEMENT, exit 3),
the three-way summary with ``--probe``, and the clear refusal on a linux cluster. The
same on real switches: ``tests/e2e/test_trace_ofproto_e2e.py``."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from podnet.cli.main import CliState, cli
from podnet.cli.trace_ofproto import matrix_lines, three_way
from podnet.client.sync import ApiClient
from podnet.cluster import matrix, ofprototrace
from podnet.cluster.matrix import Probe
from podnet.cluster.ofprototrace import (
    OfprotoCheck,
    OfprotoCluster,
    ovs_cluster,
    path,
    pod_ports,
    read_node,
)
from podnet.cluster.state import ClusterState, PodRecord
from podnet.dataplane.interface import pod_mac
from podnet.dataplane.ovs.flow import Kind, cookie
from podnet.dataplane.ovs.instance import OvsPaths
from podnet.dataplane.ovs.oftrace import OvsVerdict, TracedNode, parse_trace
from podnet.kubeconfig import ClientConfig
from podnet.policy.model import RuleSet
from podnet.policy.trace import TraceError

Obj = dict[str, Any]
NODE = cookie(Kind.NODE, "node")
POD = cookie(Kind.POD, "pod/x")
REMOTE = cookie(Kind.REMOTE_NODE, "remote/node2")
RULE = cookie(Kind.POLICY, "conj")

SOURCE_SIDE = f"""Flow: tcp,in_port=3,nw_src=10.128.0.2,nw_dst=10.128.2.2,tp_dst=80

bridge("br0")
-------------
 0. ct_state=-trk,ip, priority 1000, cookie {NODE:#x}
    ct(table=0)
    drop

Final flow: unchanged
Datapath actions: ct,recirc(0x24)

===============================================================================
recirc(0x24) - resume conntrack with default ct_state=trk|new (use --ct-next to customize)
===============================================================================

bridge("br0")
-------------
    thaw
        Resuming from table 0
 0. ip, priority 100, cookie {NODE:#x}
    goto_table:20
20. ip,in_port=3,nw_src=10.128.0.2, priority 100, cookie {POD:#x}
    load:0->NXM_NX_REG0[]
    goto_table:21
21. ip, priority 200, cookie {RULE:#x}
    goto_table:30
30. ip,nw_dst=10.128.0.0/14, priority 100, cookie {NODE:#x}
    goto_table:90
90. ip,nw_dst=10.128.2.0/23, priority 100, cookie {REMOTE:#x}
    set_field:192.168.100.12->tun_dst
    output:1
     -> output to native tunnel

Final flow: unchanged
Datapath actions: tnl_push(...),4
"""


def reply(steps: list[tuple[int, int, int, str]]) -> str:
    """An ``ofproto/trace`` reply of one pass: (table, priority, cookie, last action)."""
    lines = ["Flow: ip", "", 'bridge("br0")', "-------------"]
    for table, priority, value, action in steps:
        lines += [f"{table:2}. ip, priority {priority}, cookie {value:#x}", f"    {action}"]
    return "\n".join([*lines, "", "Final flow: unchanged", "Datapath actions: 3", ""])


class FakeSwitch:
    """Answers ``ofproto/trace`` like br0 would: delivered to a pod port, to vxlan0 for
    another node's subnet, dropped in table 80 for the ``denied`` destinations."""

    def __init__(self, ports: dict[str, int], denied: frozenset[str] = frozenset()) -> None:
        self.ports, self.denied = ports, denied
        self.calls: list[str] = []

    async def appctl(self, command: str, *args: str) -> str:
        assert command == "ofproto/trace" and args[0] == "br0"
        self.calls.append(args[1])
        dst = re.search(r"nw_dst=([\d.]+)", args[1])
        assert dst is not None
        port = self.ports.get(dst.group(1))
        if port is None:
            return reply([(20, 100, POD, "goto_table:21"), (90, 100, REMOTE, "output:1")])
        last = "drop" if dst.group(1) in self.denied else f"output:{port}"
        return reply([(70, 100, POD, "goto_table:80"), (80, 100, RULE, last)])


def two_nodes(denied: frozenset[str] = frozenset()) -> OfprotoCluster:
    """node1 holds 10.128.0.2 (ofport 3), node2 holds 10.128.2.2 (ofport 3)."""
    one, two = IPv4Address("10.128.0.2"), IPv4Address("10.128.2.2")
    return OfprotoCluster(
        (
            TracedNode("node1", FakeSwitch({str(one): 3}), IPv4Address("192.168.100.11"),
                       {one: (3, pod_mac(one))}),
            TracedNode("node2", FakeSwitch({str(two): 3}, denied), IPv4Address("192.168.100.12"),
                       {two: (3, pod_mac(two))}),
        )
    )  # fmt: skip


# --- the pieces -----------------------------------------------------------------------------


def test_cookies_name_their_object_kind() -> None:
    assert ofprototrace.object_kind(POD) == "pod"
    assert ofprototrace.object_kind(RULE) == "policy rule"
    assert ofprototrace.object_kind(cookie(Kind.POLICY_POD, "p")) == "pod isolation"
    assert ofprototrace.object_kind(0) == "-"
    assert ofprototrace.object_kind(0x55 << 56) == "?"


def test_the_deciding_flows_of_a_recorded_trace() -> None:
    trace = parse_trace(SOURCE_SIDE)
    assert path(trace, detail=False) == (
        "0 p1000 node -> 0 p100 node -> 20 p100 pod -> 21 p200 policy rule -> 30 p100 node "
        "-> 90 p100 remote node => output:1 (vxlan0)"
    )
    assert f"20 p100 pod ({POD:#x})" in path(trace)
    dropped = parse_trace(reply([(70, 100, POD, "goto_table:80"), (80, 0, NODE, "drop")]))
    assert path(dropped, detail=False) == "70 p100 pod -> 80 p0 node => drop"


def test_pods_come_from_ports_with_a_pod_identity() -> None:
    pod = {"podnet": "1", "address": "10.128.0.5/23"}
    found = pod_ports(
        [
            (3, pod),
            (4, {"podnet": "1", "address": "garbage"}),
            (5, {"address": "10.128.0.6/23"}),  # no identity: not a pod port
            (-1, {"podnet": "1", "address": "10.128.0.7/23"}),  # no ofport (yet)
            (2, {"podnet": "1", "address": "10.128.0.8/23"}),  # tun0's number: never a pod
        ]
    )
    assert found == {IPv4Address("10.128.0.5"): (3, pod_mac(IPv4Address("10.128.0.5")))}


def test_a_node_without_a_running_switch_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="node1 has no running Open vSwitch"):
        asyncio.run(read_node("node1", "192.168.100.11", OvsPaths(tmp_path / "ovs")))


def test_the_cluster_must_run_the_ovs_data_plane(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="needs the local cluster, and there is none"):
        ovs_cluster(tmp_path)
    ClusterState(cluster_id="t1", dataplane="linux").save(tmp_path)
    with pytest.raises(TraceError, match="runs the linux data plane"):
        ovs_cluster(tmp_path)
    ClusterState(cluster_id="t1", dataplane="ovs").save(tmp_path)
    assert ovs_cluster(tmp_path).dataplane == "ovs"


def test_verdict_across_nodes_enters_the_second_from_the_tunnel() -> None:
    cluster = two_nodes()
    rules = RuleSet("redhat/openshift-ovs-subnet", (), frozenset())
    src, dst = IPv4Address("10.128.0.2"), IPv4Address("10.128.2.2")
    verdict = asyncio.run(cluster.verdict(rules, src, dst, "TCP", 80))
    assert verdict is not None and verdict.allowed
    assert [name for name, _ in verdict.traces] == ["node1", "node2"]
    switch = cluster.nodes[1].switch
    assert isinstance(switch, FakeSwitch)
    second = switch.calls
    assert second == ["in_port=1,tcp,tun_id=0x0,tun_src=192.168.100.11,nw_src=10.128.0.2,"
                      "nw_dst=10.128.2.2,tcp_src=40000,tcp_dst=80"]  # fmt: skip
    outside = asyncio.run(cluster.verdict(rules, IPv4Address("8.8.8.8"), IPv4Address("1.1.1.1"),
                                          "TCP", 80))  # fmt: skip
    assert outside is None  # neither end is a pod on a switch: not traced


def test_checks_and_their_lines() -> None:
    traced = parse_trace(SOURCE_SIDE)
    agree = OfprotoCheck(True, OvsVerdict(True, (("node1", traced),)))
    differ = OfprotoCheck(True, OvsVerdict(False, (("node1", traced),)))
    untraced = OfprotoCheck(False, None)
    assert agree.agrees and agree.line() == "ofproto/trace: ALLOWED (OVS agrees)"
    assert not differ.agrees and differ.line().startswith(
        "DISAGREEMENT: the rules say ALLOWED but OVS's ofproto/trace drops it"
    )
    assert untraced.agrees and "not traced" in untraced.line() and untraced.decided() == []
    assert agree.decided(detail=False) == [f"  node1 br0: {path(traced, detail=False)}"]
    pairs = [("a", "b"), ("b", "a"), ("a", "c")]
    lines = matrix_lines(pairs, [agree, differ, untraced])
    assert lines[-1] == "ofproto/trace on 2 pairs: 1 agree with podnet, 1 disagree"
    assert lines[-2].startswith("b -> a: DISAGREEMENT")
    summary, ok = three_way(dict(zip(pairs, [agree, agree, agree], strict=True)),
                            {("a", "b"): True, ("b", "a"): False, ("a", "c"): True})  # fmt: skip
    assert (
        not ok and summary[0].startswith("b -> a: DISAGREEMENT") and "probe differs" in summary[0]
    )
    assert summary[-1] == "three ways (podnet, ofproto/trace, probe): 2 of 3 pairs agree"
    summary, ok = three_way({("a", "b"): agree}, {("a", "b"): True})
    assert ok and summary == ["three ways (podnet, ofproto/trace, probe): 1 of 1 pairs agree"]


# --- the CLI ----------------------------------------------------------------------------------


def pod(name: str, ns: str, ip: str, node: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "podIP": ip},
    }


PODS = [pod("a", "x", "10.128.0.2", "node1"), pod("b", "x", "10.128.2.2", "node2")]


def handler(request: httpx.Request) -> httpx.Response:
    plural = request.url.path.rstrip("/").split("/")[-1]
    if plural == "default":
        return httpx.Response(200, json={"pluginName": "redhat/openshift-ovs-networkpolicy"})
    items = {"pods": PODS, "namespaces": [{"metadata": {"name": "x"}}]}.get(plural, [])
    return httpx.Response(200, json={"kind": "List", "items": items})


def run(*args: str) -> Result:
    def factory(config: ClientConfig, *, log: Callable[[str], None] | None = None) -> ApiClient:
        return ApiClient(config, transport=httpx.MockTransport(handler), log=log)

    state = CliState(make_client=factory, load_config=lambda _path: ClientConfig("https://t:1"))
    return CliRunner().invoke(cli, ["trace", *args], obj=state)


@pytest.fixture
def ovs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A recorded ovs cluster with x/a and x/b; its switches are ``two_nodes``."""
    state = ClusterState(cluster_id="t1", dataplane="ovs", plugin="networkpolicy")
    for p in PODS:
        meta = p["metadata"]
        record = PodRecord(meta["name"], "x", p["spec"]["nodeName"], f"pn-{meta['name']}", "c")
        record.ip = p["status"]["podIP"]
        state.pods[record.key] = record
    state.save(tmp_path)
    monkeypatch.setattr(matrix, "probe", lambda *_a, **_k: Probe(True, 0.1))
    yield tmp_path


def use(monkeypatch: pytest.MonkeyPatch, cluster: OfprotoCluster) -> None:
    async def load(_state_dir: Path) -> OfprotoCluster:
        return cluster

    monkeypatch.setattr(OfprotoCluster, "load", staticmethod(load))


def test_cli_pair_agrees(ovs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, two_nodes())
    result = run("x/a", "x/b", "--port", "80", "--ofproto", "--probe", "--state-dir", str(ovs_dir))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    at = lines.index("ofproto/trace: ALLOWED (OVS agrees)")
    assert (
        lines[at + 1].startswith("  node1 br0: 20 p100 pod")
        and "output:1 (vxlan0)" in lines[at + 1]
    )
    assert lines[at + 2].startswith("  node2 br0: 70 p100 pod") and lines[at + 2].endswith(
        "output:3"
    )
    assert lines[-1] == "probe: connected (data plane agrees)"


def test_cli_disagreement_exits_3(ovs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, two_nodes(denied=frozenset({"10.128.2.2"})))
    result = run("x/a", "x/b", "--port", "80", "--ofproto", "--state-dir", str(ovs_dir))
    assert result.exit_code == 3, result.output
    assert "DISAGREEMENT: the rules say ALLOWED but OVS's ofproto/trace drops it" in result.stdout
    assert "80 p100 policy rule" in result.stdout and "=> drop" in result.stdout

    result = run("--matrix", "--port", "80", "--ofproto", "--probe", "--state-dir", str(ovs_dir))
    assert result.exit_code == 3, result.output
    assert "ofproto/trace on 2 pairs: 1 agree with podnet, 1 disagree" in result.stdout
    assert "three ways (podnet, ofproto/trace, probe): 1 of 2 pairs agree" in result.stdout


def test_cli_matrix_three_ways(ovs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, two_nodes())
    result = run("--matrix", "--port", "80", "--ofproto", "--probe", "--state-dir", str(ovs_dir))
    assert result.exit_code == 0, result.output
    assert (
        "x/a -> x/b: ofproto/trace: ALLOWED (OVS agrees): node1 br0: 20 p100 pod" in result.stdout
    )
    assert result.stdout.splitlines()[-1] == (
        "three ways (podnet, ofproto/trace, probe): 2 of 2 pairs agree"
    )


def test_cli_on_a_linux_cluster_is_one_clear_line(tmp_path: Path) -> None:
    ClusterState(cluster_id="t1", dataplane="linux").save(tmp_path)
    result = run("x/a", "x/b", "--ofproto", "--state-dir", str(tmp_path))
    assert result.exit_code == 1 and result.stdout == "", result.output
    assert result.stderr.count("\n") == 1
    assert "--ofproto needs the ovs data plane" in result.stderr
    assert "runs the linux data plane" in result.stderr
