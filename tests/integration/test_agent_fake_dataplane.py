"""``podnet node --dataplane fake`` as a real process, with a real master and the real shim.

The runtime's side is played by running the installed CNI plugin (the C shim, or the
Python launcher without gcc) with ``CNI_*`` variables and a config on stdin.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from podnet.cni.build import install_shim
from podnet.controllers.config import NETWORKPOLICY
from podnet.master import node_credentials
from podnet.policy.compile import cluster_pod_networks, compile_rules, hostsubnet_addresses
from podnet.policy.model import RuleSet
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for, namespace, pod
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess, launch_master

NODE = "node-1"
NODE_IP = "192.0.2.10"
NETWORK = "podnet"


@dataclass
class Shim:
    """The installed CNI plugin, run as a runtime runs it."""

    path: Path
    socket: Path
    cni_version: str = "1.0.0"

    def config(self, **extra: Any) -> str:
        base = {"cniVersion": self.cni_version, "name": NETWORK, "type": "podnet"}
        return json.dumps({**base, "socketPath": str(self.socket), "mtu": 1450, **extra})

    def run(self, env: dict[str, str], stdin: str | None = None) -> tuple[int, Any, str]:
        full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_PATH": "/opt/cni/bin"}
        proc = subprocess.run(
            [str(self.path)],
            input=(self.config() if stdin is None else stdin).encode(),
            env={**full, **env},
            capture_output=True,
            timeout=60,
        )
        out = proc.stdout.decode()
        assert "Traceback" not in out + proc.stderr.decode()
        return proc.returncode, json.loads(out) if out.strip() else None, proc.stderr.decode()

    def add(self, cid: str, pod: str = "", ifname: str = "eth0") -> tuple[int, Any]:
        args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}" if pod else ""
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_IFNAME": ifname}
        env |= {"CNI_NETNS": f"/var/run/netns/{cid}", "CNI_ARGS": args}
        code, out, _ = self.run(env)
        return code, out

    def delete(self, cid: str, netns: str | None = None, pod: str = "") -> tuple[int, Any]:
        env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_IFNAME": "eth0"}
        if netns is not None:
            env["CNI_NETNS"] = netns
        if pod:
            env["CNI_ARGS"] = f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}"
        code, out, _ = self.run(env)
        return code, out


@dataclass
class Agent:
    """A ``podnet node`` child process, stopped by PID."""

    root: Path
    kubeconfig: Path
    process: subprocess.Popen[bytes] | None = None
    offsets: list[int] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.root / "run" / "cni-server.sock"

    @property
    def log_path(self) -> Path:
        return self.root / "agent.log"

    @property
    def ipam_dir(self) -> Path:
        return self.root / "ipam" / NETWORK

    @property
    def state_file(self) -> Path:
        return self.root / "state" / "fake-dataplane.json"

    def command(self) -> list[str]:
        dirs = {
            "--cni-bin-dir": "bin",
            "--cni-conf-dir": "conf",
            "--state-dir": "state",
            "--ipam-dir": "ipam",
        }
        args = [sys.executable, "-m", "podnet", "node", "--kubeconfig", str(self.kubeconfig)]
        args += ["--node-name", NODE, "--node-ip", NODE_IP, "--socket", str(self.socket)]
        for option, name in dirs.items():
            args += [option, str(self.root / name)]
        return [*args, "--dataplane", "fake", "--resync-period", "2"]

    def start(self, timeout: float = 60.0) -> Agent:
        self.offsets.append(self.log_path.stat().st_size if self.log_path.exists() else 0)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.wait_for_log(f"node {NODE} ready", timeout)
        return self

    def log(self, run: int = -1) -> str:
        text = self.log_path.read_text() if self.log_path.exists() else ""
        return text[self.offsets[run] :] if self.offsets else text

    def wait_for_log(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"agent exited:\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {text!r} in the agent log:\n{self.log()[-4000:]}")
            time.sleep(0.05)

    def signal(self, sig: int) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        code = self.process.wait(20)
        self.process = None
        return code

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def fake_state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.state_file.read_text())
        return state

    def ip_files(self) -> list[str]:
        return sorted(p.name for p in self.ipam_dir.iterdir() if p.name[0].isdigit())

    def timings(self, command: str) -> list[float]:
        pattern = rf"CNI {command} .* ok in ([0-9.]+) ms"
        return [float(m) for m in re.findall(pattern, self.log(0))]


def _start_agent(master: MasterProcess, root: Path) -> Agent:
    kubeconfig = node_credentials(master.state_dir, NODE, master.server, root / "node.kubeconfig")
    return Agent(root, kubeconfig).start()


@pytest.fixture
def agent(master: MasterProcess, tmp_path: Path) -> Iterator[Agent]:
    running = _start_agent(master, tmp_path / "agent")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def shim(agent: Agent) -> Shim:
    return Shim(install_shim(agent.root / "shim-bin", sys.executable), agent.socket)


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    wait_for(condition, timeout, what)


def _pod_ips(master: MasterProcess) -> dict[str, str | None]:
    with client_for(master.kubeconfig) as api:
        items = api.get("/api/v1/namespaces/default/pods").json()["items"]
    return {p["metadata"]["name"]: (p.get("status") or {}).get("podIP") for p in items}


def test_node_registered_ready_and_conflist_written(master: MasterProcess, agent: Agent) -> None:
    with client_for(master.kubeconfig) as api:
        node = api.get(f"/api/v1/nodes/{NODE}").json()
        hostsubnet = api.get(f"/apis/network.openshift.io/v1/hostsubnets/{NODE}").json()
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    assert {"type": "InternalIP", "address": NODE_IP} in node["status"]["addresses"]
    assert hostsubnet["hostIP"] == NODE_IP
    conflist = json.loads((agent.root / "conf" / "10-podnet.conflist").read_text())
    assert conflist["plugins"][0] == {
        "type": "podnet",
        "socketPath": str(agent.socket),
        "mtu": 1450,
    }
    assert (agent.socket.stat().st_mode & 0o777) == 0o600
    assert (agent.socket.parent.stat().st_mode & 0o777) == 0o700
    assert os.access(agent.root / "bin" / "podnet", os.X_OK)
    log = agent.log()
    assert log.index("registered node") < log.index("data plane needs set-up")
    assert log.index("data plane set up") < log.index("CNI server listening")


def test_fifty_concurrent_adds_then_dels(master: MasterProcess, agent: Agent, shim: Shim) -> None:
    names = [f"pod-{i}" for i in range(50)]
    started = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda n: shim.add(f"cid-{n}", n), names))
    wall = time.perf_counter() - started
    assert all(code == 0 for code, _ in results), results
    ips = {out["ips"][0]["address"].split("/")[0] for _, out in results}
    assert len(ips) == 50
    assert len(agent.ip_files()) == 50
    _wait(lambda: sum(ip is not None for ip in _pod_ips(master).values()) == 50, "pod IPs")
    assert set(_pod_ips(master).values()) == ips
    with ThreadPoolExecutor(16) as pool:
        deleted = list(
            pool.map(lambda n: shim.delete(f"cid-{n}", f"/var/run/netns/cid-{n}"), names)
        )
    assert all(code == 0 for code, _ in deleted), deleted
    assert agent.ip_files() == []
    assert agent.fake_state()["pods"] == []
    _wait(lambda: all(ip is None for ip in _pod_ips(master).values()), "pod IPs cleared")
    adds, dels = agent.timings("ADD"), agent.timings("DEL")
    print(f"\n50 ADDs, 16 at a time, through the shim: {wall:.2f} s")
    print(f"agent-side ADD median {statistics.median(adds):.2f} ms, max {max(adds):.2f} ms")
    print(f"agent-side DEL median {statistics.median(dels):.2f} ms, max {max(dels):.2f} ms")


def test_del_is_idempotent_and_needs_no_netns(agent: Agent, shim: Shim) -> None:
    assert shim.add("cid-a", "pod-a")[0] == 0
    assert shim.delete("cid-a", netns=None) == (0, None)  # containerd: no CNI_NETNS
    assert shim.delete("cid-a", netns="") == (0, None)
    assert shim.delete("cid-a", netns="/var/run/netns/gone") == (0, None)
    assert shim.delete("never-added") == (0, None)
    assert agent.ip_files() == []


def test_add_of_an_existing_interface_fails_and_keeps_the_pod(agent: Agent, shim: Shim) -> None:
    code, first = shim.add("cid-dup", "pod-dup")
    assert code == 0
    code, second = shim.add("cid-dup", "pod-dup")
    assert code == 1 and second["code"] == 103
    assert len(agent.ip_files()) == 1
    assert [p["address"] for p in agent.fake_state()["pods"]] == [first["ips"][0]["address"]]


def test_gc_removes_what_the_runtime_does_not_list(agent: Agent, shim: Shim) -> None:
    for name in ("keep", "drop-1", "drop-2"):
        assert shim.add(f"cid-{name}", name)[0] == 0
    shim.cni_version = "1.1.0"
    valid = [{"containerID": "cid-keep", "ifname": "eth0"}]
    code, out, _ = shim.run(
        {"CNI_COMMAND": "GC"}, shim.config(**{"cni.dev/valid-attachments": valid})
    )
    assert (code, out) == (0, None)
    assert [p["container_id"] for p in agent.fake_state()["pods"]] == ["cid-keep"]
    assert len(agent.ip_files()) == 1
    code, out, _ = shim.run({"CNI_COMMAND": "STATUS"})
    assert (code, out) == (0, None)


def test_shim_error_paths(agent: Agent, shim: Shim, tmp_path: Path) -> None:
    add = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/x", "CNI_IFNAME": "eth0"}
    down = Shim(shim.path, tmp_path / "nowhere.sock")
    cases = [
        (down, add, None, 11),
        (shim, add, "{not json", 6),
        (shim, {"CNI_COMMAND": "ADD", "CNI_IFNAME": "eth0"}, None, 4),
        (shim, add, json.dumps({"cniVersion": "9.9.9", "name": "podnet", "type": "podnet"}), 1),
    ]
    for runner, env, stdin, expected in cases:
        code, out, _ = runner.run(env, stdin)
        assert code == 1 and out["code"] == expected, (expected, out)
        assert {"cniVersion", "code", "msg"} <= out.keys()
    assert agent.ip_files() == []


def test_exhausted_subnet(etcd: EtcdProcess, tmp_path: Path, prefix: str) -> None:
    small = launch_master(etcd, tmp_path / "master", prefix, "--cluster-network", "10.128.0.0/14:3")
    running = None
    try:
        running = _start_agent(small, tmp_path / "agent")
        shim = Shim(install_shim(tmp_path / "shim-bin", sys.executable), running.socket)
        for i in range(5):  # a /29: 8 addresses minus network, gateway, broadcast
            assert shim.add(f"cid-{i}", f"pod-{i}")[0] == 0
        code, out = shim.add("cid-5", "pod-5")
        assert code == 1 and out["code"] == 102
        assert out["msg"].startswith("no IP addresses available in range set: ")
        shim.cni_version = "1.1.0"
        code, out, _ = shim.run({"CNI_COMMAND": "STATUS"})
        assert code == 1 and out["code"] == 50
        assert len(running.ip_files()) == 5
    finally:
        if running is not None:
            running.stop()
        small.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_restart_leaves_the_data_plane_alone(agent: Agent, shim: Shim, sig: int) -> None:
    results = [shim.add(f"cid-{i}", f"pod-{i}") for i in range(3)]
    before = agent.fake_state()["pods"]
    assert agent.signal(sig) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
    assert agent.socket.exists() == (sig == signal.SIGKILL)  # SIGKILL leaves a stale one
    assert agent.fake_state()["pods"] == before  # nothing torn down
    agent.start()
    assert "data plane in place; not touching it" in agent.log()
    assert "removing stale CNI socket" in agent.log() or sig == signal.SIGTERM
    calls = agent.fake_state()["calls"]
    assert calls.count("setup_node") == 1
    assert calls.count("detach_pod") == 0
    assert agent.fake_state()["pods"] == before
    assert shim.add("cid-new", "pod-new")[0] == 0
    for i, (_, out) in enumerate(results):
        assert shim.delete(f"cid-{i}", f"/var/run/netns/cid-{i}")[0] == 0
        assert out["ips"][0]["address"].split("/")[0] not in agent.ip_files()


def test_second_agent_on_the_same_socket_refuses(master: MasterProcess, agent: Agent) -> None:
    other = Agent(agent.root, agent.kubeconfig)
    with pytest.raises(RuntimeError, match="another podnet agent is serving"):
        other.start(timeout=30)
    other.stop()
    assert agent.process is not None and agent.process.poll() is None


def _cluster_rules(master: MasterProcess, plugin: str) -> RuleSet:
    """``compile_rules`` over what the API holds now."""
    paths = {
        "pods": "/api/v1/pods",
        "namespaces": "/api/v1/namespaces",
        "netnamespaces": "/apis/network.openshift.io/v1/netnamespaces",
        "policies": "/apis/networking.k8s.io/v1/networkpolicies",
        "hostsubnets": "/apis/network.openshift.io/v1/hostsubnets",
    }
    with client_for(master.kubeconfig) as api:
        items = {name: api.get(path).json()["items"] for name, path in paths.items()}
        network = api.get("/apis/network.openshift.io/v1/clusternetworks/default").json()
    ips = [hs["hostIP"] for hs in items["hostsubnets"]]
    return compile_rules(
        plugin,
        items["pods"],
        items["namespaces"],
        items["netnamespaces"],
        items["policies"],
        node_ips=ips,
        node_addresses=[pair for hs in items["hostsubnets"] for pair in hostsubnet_addresses(hs)],
        pod_networks=cluster_pod_networks(network),
    )


def test_policy_rules_follow_the_api(etcd: EtcdProcess, tmp_path: Path, prefix: str) -> None:
    master = launch_master(etcd, tmp_path / "master", prefix, "--network-plugin", "networkpolicy")
    running = None
    try:
        running = _start_agent(master, tmp_path / "agent")
        with client_for(master.kubeconfig) as api:
            api.post("/api/v1/namespaces", json=namespace("shop", {"team": "a"})).raise_for_status()
            for i in range(4):
                labels = {"app": "web" if i % 2 else "db"}
                made = api.post(
                    "/api/v1/namespaces/shop/pods", json=pod(f"p{i}", "shop", NODE, labels)
                )
                made.raise_for_status()
                body = {**made.json(), "status": {"phase": "Running", "podIP": f"10.128.0.{i + 2}"}}
                api.put(f"/api/v1/namespaces/shop/pods/p{i}/status", json=body).raise_for_status()
            policy = {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "db-from-web", "namespace": "shop"},
                "spec": {
                    "podSelector": {"matchLabels": {"app": "db"}},
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}],
                },
            }
            path = "/apis/networking.k8s.io/v1/namespaces/shop/networkpolicies"
            api.post(path, json=policy).raise_for_status()

        def applied() -> bool:
            want = _cluster_rules(master, NETWORKPOLICY)
            got = running.fake_state().get("policy_fingerprint") if running else None
            return bool(want.policies) and got == want.fingerprint()

        _wait(applied, "the compiled policy rules in the fake data plane")
        assert "policy rules applied (networkpolicy)" in running.log()
        rules = _cluster_rules(master, NETWORKPOLICY)
        assert len(rules.endpoints) == 4 and len(rules.ingress_isolated) == 2
    finally:
        if running is not None:
            running.stop()
        master.stop()
