"""The local cluster's recorded state, process identity, naming and pod helpers (no root)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from podnet.cluster import lifecycle, pods
from podnet.cluster.nodes import agent_command, agent_needle, new_node_record, node_paths
from podnet.cluster.state import (
    ClusterState,
    ExternalHost,
    NodeRecord,
    PodRecord,
    ProcessRecord,
    StateFileError,
    locked,
    new_cluster_id,
    other_threads,
    proc_start_time,
    process_state,
    spawn,
    wait_exited,
)
from podnet.cluster.underlay import external_address, node_address, uplink_name
from podnet.testing.e2e import wait_for


def make_state(cluster_id: str = "abc123") -> ClusterState:
    state = ClusterState(cluster_id=cluster_id, underlay_cidr="192.168.100.0/24")
    state.nodes["node1"] = NodeRecord("node1", 1, "pn-abc123-node1", "192.168.100.11")
    state.nodes["node2"] = NodeRecord("node2", 2, "pn-abc123-node2", "192.168.100.12")
    return state


def test_state_round_trips_with_nested_records(tmp_path: Path) -> None:
    state = make_state()
    state.nodes["node1"].agent = ProcessRecord(123, "--state-dir /x ", 456)
    state.pods["default/a"] = PodRecord(
        "a",
        "default",
        "node1",
        "pn-abc123-p-1",
        "c" * 64,
        "10.128.0.2",
        {"app": "x"},
        ProcessRecord(124, "echo", 457),
    )
    state.external = ExternalHost("pn-abc123-ext", "192.168.100.250", ProcessRecord(9, "e", 1))
    state.namespaces = ["pn-abc123-underlay", "pn-abc123-ext"]
    state.save(tmp_path)
    assert ClusterState.load(tmp_path) == state
    assert not (tmp_path / "state.tmp").exists()


def test_state_written_by_the_control_plane_alone_still_loads(tmp_path: Path) -> None:
    old = {
        "plugin": "multitenant",
        "etcd_pid": 1,
        "etcd_port": 2,
        "etcd_peer_port": 3,
        "master_pid": 4,
        "master_port": 5,
        "extra": {},
    }
    (tmp_path / "state.json").write_text(json.dumps(old))
    state = ClusterState.load(tmp_path)
    assert state is not None and state.plugin == "multitenant" and state.nodes == {}
    assert state.cluster_id == "" and state.external is None


def test_state_naming_the_tunnel_backend_still_loads(tmp_path: Path) -> None:
    """State files written before issue 9 call the tunnel "backend"."""
    (tmp_path / "state.json").write_text(json.dumps({"cluster_id": "abc", "backend": "host-gw"}))
    state = ClusterState.load(tmp_path)
    assert state is not None and state.tunnel == "host-gw"
    both = {"backend": "host-gw", "tunnel": "vxlan"}
    (tmp_path / "state.json").write_text(json.dumps(both))
    with pytest.raises(StateFileError, match=r"tunnel 'vxlan' and .* backend 'host-gw'"):
        ClusterState.load(tmp_path)


def test_no_state_means_no_cluster(tmp_path: Path) -> None:
    assert ClusterState.load(tmp_path) is None


def test_cluster_ids_are_random_short_hex() -> None:
    ids = {new_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"[0-9a-f]{6}", i) for i in ids)


def test_every_name_carries_the_prefix_and_fits_a_link_name() -> None:
    state = make_state()
    node = new_node_record(state, 12)
    assert node.netns == "pn-abc123-node12" and node.ip == "192.168.100.22"
    assert len(uplink_name(state)) <= 15 and uplink_name(state).startswith("pn-abc123-")
    assert len(f"{state.prefix()}-n{node.index}") <= 15
    netns_name = pods.pod_netns_name(state, "default", "web")
    assert netns_name.startswith("pn-abc123-p-")
    assert netns_name == pods.pod_netns_name(state, "default", "web")
    assert netns_name != pods.pod_netns_name(state, "other", "web")


def test_underlay_addresses() -> None:
    state = make_state()
    assert str(node_address(state, 1)) == "192.168.100.11/24"
    assert str(external_address(state)) == "192.168.100.250/24"


def test_process_record_knows_its_own_process() -> None:
    me = ProcessRecord.of(os.getpid(), "python")
    assert me.start == proc_start_time(os.getpid()) > 0
    assert me.alive()
    assert not ProcessRecord(os.getpid(), "python", me.start + 1).alive()  # a recycled PID
    assert not ProcessRecord(os.getpid(), "no-such-command-line", me.start).alive()
    assert not ProcessRecord(0, "python").alive()


def test_spawn_records_and_stop_ends_the_process(tmp_path: Path) -> None:
    record = spawn(["sleep", "30"], tmp_path / "log" / "sleep.log", "sleep 30")
    try:
        assert record.alive() and record.start > 0
        assert record.stop(timeout=5)
        assert not record.alive()
        assert not record.stop()  # already gone: nothing is signalled
    finally:
        if record.alive():
            os.kill(record.pid, 9)


def test_spawn_reports_a_command_that_exits_at_once(tmp_path: Path) -> None:
    wrapped = ["nsenter", f"--net={tmp_path / 'no-such-netns'}", "--", "sleep", "5"]
    with pytest.raises(RuntimeError, match="exited at once"):
        spawn(wrapped, tmp_path / "nsenter.log", "sleep 5")
    with pytest.raises(ValueError, match="not part of the command line"):
        spawn(["false"], tmp_path / "false.log", "never-in-the-command-line")


def test_lock_serialises_writers(tmp_path: Path) -> None:
    script = (
        "import sys,time; from pathlib import Path; from podnet.cluster.state import locked\n"
        "with locked(Path(sys.argv[1])): print('got', flush=True)\n"
    )
    with locked(tmp_path):
        other = subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE
        )
        # The kernel lists a process waiting for a flock in /proc/locks ("->" lines).
        wait_for(lambda: blocked_in_flock(other.pid), 10, "the other writer to wait")
        assert other.poll() is None  # blocked on our lock
    assert other.communicate(timeout=10)[0] == b"got\n"


def blocked_in_flock(pid: int) -> bool:
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if fields[1:3] == ["->", "FLOCK"] and len(fields) > 5 and fields[5] == str(pid):
            return True
    return False


def test_choose_node_picks_the_least_loaded_then_the_lowest_index() -> None:
    state = make_state()
    assert pods.choose_node(state) == "node1"
    state.pods["default/a"] = PodRecord("a", "default", "node1", "n", "c")
    assert pods.choose_node(state) == "node2"
    state.pods["default/b"] = PodRecord("b", "default", "node2", "n", "c")
    assert pods.choose_node(state) == "node1"
    with pytest.raises(pods.PodError, match="no nodes"):
        pods.choose_node(ClusterState(cluster_id="x"))


def test_cni_environment_is_what_a_runtime_sends(tmp_path: Path) -> None:
    pod = PodRecord("web", "shop", "node1", "pn-abc123-p-1", "f" * 64)
    env = pods.cni_env(pod, "ADD", tmp_path, "/run/netns/pn-abc123-p-1")
    assert env["CNI_COMMAND"] == "ADD" and env["CNI_IFNAME"] == "eth0"
    assert env["CNI_NETNS"] == "/run/netns/pn-abc123-p-1"
    assert env["CNI_PATH"] == f"{tmp_path}:/usr/lib/cni"
    assert "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web" in env["CNI_ARGS"]
    assert env["CNI_ARGS"].startswith("IgnoreUnknown=1;")


def test_plugin_config_comes_from_the_conflist(tmp_path: Path) -> None:
    conflist = {
        "cniVersion": "1.0.0",
        "name": "podnet",
        "plugins": [
            {"type": "podnet", "socketPath": "/x/cni.sock"},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    path = tmp_path / "10-podnet.conflist"
    path.write_text(json.dumps(conflist))
    assert json.loads(pods.plugin_config(path)) == {
        "cniVersion": "1.0.0",
        "name": "podnet",
        "type": "podnet",
        "socketPath": "/x/cni.sock",
    }
    path.write_text(json.dumps({**conflist, "plugins": []}))
    with pytest.raises(pods.PodError, match="no podnet plugin"):
        pods.plugin_config(path)


def test_result_ip() -> None:
    result = {"cniVersion": "1.0.0", "ips": [{"address": "10.128.0.5/23", "gateway": "10.128.0.1"}]}
    assert pods.result_ip(result) == "10.128.0.5"
    with pytest.raises(pods.PodError, match="no IP"):
        pods.result_ip({"ips": []})


def test_agent_runs_inside_its_node_namespace(tmp_path: Path) -> None:
    state = make_state()
    node = state.nodes["node1"]
    paths = node_paths(tmp_path, "node1")
    argv = agent_command(state, node, paths)
    assert argv[:3] == ["nsenter", "--net=/run/netns/pn-abc123-node1", "--"]
    joined = " ".join(argv) + " "
    assert agent_needle(paths) in joined
    for flag in (
        "--node-name node1",
        "--node-ip 192.168.100.11",
        "--tunnel vxlan",
        f"--socket {paths.socket}",
        "--dataplane linux",
    ):
        assert flag in joined


def test_endpoints_are_ordered_by_node_and_named_by_namespace_when_mixed() -> None:
    state = make_state()
    state.pods["b/x"] = PodRecord("x", "b", "node2", "n2", "c", "10.128.2.2")
    state.pods["a/y"] = PodRecord("y", "a", "node1", "n1", "c", "10.128.0.2")
    state.pods["a/z"] = PodRecord("z", "a", "node1", "n3", "c", "")  # not wired: skipped
    assert [e.name for e in lifecycle.endpoints(state)] == ["a/y", "b/x"]
    assert [e.name for e in lifecycle.endpoints(state, ["b"])] == ["x"]


def test_down_removes_only_recorded_namespaces_with_the_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    removed: list[str] = []
    monkeypatch.setattr(lifecycle.netns, "remove", lambda name: removed.append(name) or True)
    state = make_state()
    state.namespaces = ["pn-abc123-underlay", "pn-abc123-node1", "somebody-elses", "pn-abc1234"]
    lines: list[str] = []
    lifecycle.remove_namespaces(state, lines.append)
    assert removed == ["pn-abc123-node1", "pn-abc123-underlay"]
    assert sum("not removing" in line for line in lines) == 2


def test_down_without_state_does_nothing(tmp_path: Path) -> None:
    lines: list[str] = []
    lifecycle.cluster_down(tmp_path / "none", lines.append)
    assert lines == [f"no cluster state at {tmp_path / 'none'}; nothing to do"]
    assert not (tmp_path / "none").exists()


def test_up_refuses_to_switch_tunnel(tmp_path: Path) -> None:
    state = make_state()
    state.save(tmp_path)
    spec = lifecycle.ClusterSpec(nodes=1, tunnel="host-gw")
    with pytest.raises(lifecycle.ClusterError, match="vxlan tunnel"):
        lifecycle.cluster_up(tmp_path, spec, lambda _line: None)


def test_up_refuses_to_switch_dataplane(tmp_path: Path) -> None:
    state = make_state()
    state.save(tmp_path)
    before = (tmp_path / "state.json").read_text()
    spec = lifecycle.ClusterSpec(nodes=1, dataplane="ovs")
    with pytest.raises(lifecycle.ClusterError, match="runs the linux data plane"):
        lifecycle.cluster_up(tmp_path, spec, lambda _line: None)
    assert (tmp_path / "state.json").read_text() == before


def test_up_refuses_an_unknown_dataplane_before_anything_starts(tmp_path: Path) -> None:
    spec = lifecycle.ClusterSpec(nodes=1, dataplane="fake")
    with pytest.raises(lifecycle.ClusterError, match="unknown data plane 'fake'"):
        lifecycle.cluster_up(tmp_path / "new", spec, lambda _line: None)
    assert not (tmp_path / "new").exists()


def test_old_state_files_run_the_linux_dataplane(tmp_path: Path) -> None:
    data = asdict(make_state())
    del data["dataplane"]
    assert ClusterState.from_dict(data).dataplane == "linux"


def read_request(conn: Any) -> bytes:
    """One whole HTTP request (headers and Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def test_socket_answers_means_a_successful_cni_status(tmp_path: Path) -> None:
    import socket
    import threading

    from podnet.cluster.nodes import socket_answers

    path = tmp_path / "cni.sock"
    assert not socket_answers(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(2)
    requests: list[bytes] = []

    def answer(*statuses: bytes) -> None:
        for status in statuses:
            conn, _ = server.accept()
            with conn:
                requests.append(read_request(conn))
                conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=answer, args=(b"200 OK", b"500 Oops"), daemon=True)
    thread.start()
    try:
        assert socket_answers(path)
        assert not socket_answers(path)
        assert b'"CNI_COMMAND": "STATUS"' in requests[0] and b"1.1.0" in requests[0]
    finally:
        thread.join(5)
        server.close()


# A child whose first thread ends (pthread_exit: /proc shows it as a zombie) while a
# second thread still holds a listening socket, until it reads a line on stdin.
LINGERING_THREAD = """
import ctypes, socket, sys, threading
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen()
print(sock.getsockname()[1], flush=True)
threading.Thread(target=lambda: (sys.stdin.readline(), sock.close())).start()
ctypes.CDLL(None).pthread_exit(None)
"""


def test_wait_exited_waits_for_every_thread_not_only_the_zombie_leader() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", LINGERING_THREAD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        port = int(child.stdout.readline())
        wait_for(lambda: process_state(child.pid) == "Z", 10, "the first thread to end")
        assert other_threads(child.pid) == 1
        with pytest.raises(TimeoutError):
            wait_exited(child.pid, timeout=0.3)  # the port is still held
        child.stdin.write("\n")
        child.stdin.flush()
        wait_exited(child.pid)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free once wait_exited returned
    finally:
        child.kill()
        child.wait()
