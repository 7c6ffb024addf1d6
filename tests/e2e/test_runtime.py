"""Real runtimes against a real node: concurrent CNI calls through the shim, and podman 4.3.

A 2-node vxlan cluster (etcd, master, agents in node namespaces, linux data plane). The
CNI calls run inside node1's namespace exactly as a runtime makes them. podman runs on
its CNI backend inside node1's namespace with the conflist the agent installed (podnet,
then the reference portmap plugin), confined to a temporary folder. Issue 19, finding
10, with that runtime: a podman container gets a mirror Pod from the agent, and
``podman rm`` (its CNI DEL) removes it for good.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest

from podnet import netns
from podnet.cluster import lifecycle, nodes, pods
from podnet.cluster.state import ClusterState
from podnet.model.kinds import HOST_SUBNET, POD
from podnet.model.schemas_names import dns_subdomain_problem
from podnet.testing import docsteps, planeview, tools
from podnet.testing.e2e import TEST_DATAPLANE, wait_for
from podnet.testing.podman import IMAGE, RECIPE, PodmanEnv

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state_dir = tmp_path_factory.mktemp("pn-runtime")
    try:
        lifecycle.cluster_up(
            state_dir, lifecycle.ClusterSpec(nodes=2, dataplane=TEST_DATAPLANE), say=print
        )
        pods.run_pod(state_dir, "target", node="node2")
        yield state_dir
    finally:
        lifecycle.cluster_down(state_dir, say=print)


def node_record(state_dir: Path, name: str) -> Any:
    state = ClusterState.load(state_dir)
    assert state is not None
    return state.nodes[name]


def cni(
    state_dir: Path,
    node: str,
    command: str,
    cid: str,
    pod_ns: str | None,
    extra: dict[str, Any] | None = None,
) -> subprocess.CompletedProcess[str]:
    """One CNI call through node's installed shim, from inside the node namespace."""
    paths = nodes.node_paths(state_dir, node)
    conflist = json.loads(paths.conflist.read_text())
    config = {
        "cniVersion": conflist["cniVersion"],
        "name": conflist["name"],
        **conflist["plugins"][0],
        **(extra or {}),
    }
    env = {
        "PATH": os.environ["PATH"],
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": str(netns.path(pod_ns)) if pod_ns else "",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": f"{paths.cni_bin_dir}:/usr/lib/cni",
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={cid}",
    }
    argv = netns.command(node_record(state_dir, node).netns, [str(paths.shim)])
    return subprocess.run(
        argv, input=json.dumps(config), env=env, capture_output=True, text=True, timeout=60
    )


def pod_veths(node_ns: str) -> list[str]:
    links = json.loads(
        subprocess.run(
            ["ip", "-j", "-n", node_ns, "link"], capture_output=True, text=True, check=True
        ).stdout
    )
    return [link["ifname"] for link in links if link["ifname"].startswith("pn")]


def anti_spoof_addresses(state_dir: Path, node: str) -> set[str]:
    """The addresses ``node`` lets its pods send with (see ``planeview.anti_spoofing``)."""
    state = ClusterState.load(state_dir)
    assert state is not None
    return {ip for _, _, ip in planeview.anti_spoofing(state_dir, state, node)}


def ip_files(state_dir: Path, node: str) -> list[str]:
    root = nodes.node_paths(state_dir, node).ipam_dir
    return sorted(p.name for p in root.rglob("*") if p.is_file() and p.name[0].isdigit())


def test_fifty_concurrent_adds_then_dels_leave_nothing(cluster: Path) -> None:
    node_ns = node_record(cluster, "node1").netns
    before_veths, before_ips = pod_veths(node_ns), ip_files(cluster, "node1")
    tag = uuid.uuid4().hex[:4]
    names = [f"{node_ns[:9]}-c{tag}{i}" for i in range(50)]
    for name in names:
        netns.create(name)
    try:
        with ThreadPoolExecutor(max_workers=50) as pool:
            answers = list(pool.map(lambda n: cni(cluster, "node1", "ADD", n, n), names))
        assert all(a.returncode == 0 for a in answers), [a.stdout for a in answers if a.returncode][
            :2
        ]
        ips = [json.loads(a.stdout)["ips"][0]["address"] for a in answers]
        assert len(set(ips)) == 50
        assert len(pod_veths(node_ns)) == len(before_veths) + 50
        # A spec GC: everything not listed goes; here the last pod is not listed.
        keep = [{"containerID": n, "ifname": "eth0"} for n in names[:-1]]
        gc = cni(
            cluster,
            "node1",
            "GC",
            names[0],
            None,
            {"cniVersion": "1.1.0", "cni.dev/valid-attachments": keep},
        )
        assert gc.returncode == 0, gc.stdout
        assert len(pod_veths(node_ns)) == len(before_veths) + 49
        netns.remove(names[0])  # DEL with the netns already gone
        with ThreadPoolExecutor(max_workers=16) as pool:
            dels = list(
                pool.map(
                    lambda n: cni(cluster, "node1", "DEL", n, n if netns.exists(n) else None), names
                )
            )
        assert all(d.returncode == 0 for d in dels), [d.stdout for d in dels if d.returncode][:2]
        again = cni(cluster, "node1", "DEL", names[1], None)
        assert again.returncode == 0, again.stdout
        assert pod_veths(node_ns) == before_veths
        assert ip_files(cluster, "node1") == before_ips
        left = anti_spoof_addresses(cluster, "node1")
        for ip in ips:
            assert ip.split("/")[0] not in left
    finally:
        for name in names:
            netns.remove(name)


@pytest.fixture(scope="module")
def podman(cluster: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodmanEnv]:
    for tool in ("podman", "runc", "busybox", "host-local"):
        tools.require(tool)
    paths = nodes.node_paths(cluster, "node1")
    env = PodmanEnv(tmp_path_factory.mktemp("podman"), paths.cni_bin_dir, paths.cni_conf_dir)
    env.write_config()
    env.build_image()
    yield env
    node_ns = node_record(cluster, "node1").netns
    env.podman(node_ns, "rm", "-a", "-f", "-t", "0", check=False)


def container_ip(env: PodmanEnv, node_ns: str, name: str) -> str:
    out = env.podman(
        node_ns, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name
    ).stdout
    return out.strip()


def nc_echo(env: PodmanEnv, node_ns: str, ip: str, port: int) -> str:
    """From a throwaway container: send a line to ip:port, return what came back."""
    result = env.podman(
        node_ns,
        "run",
        "--rm",
        "--network",
        "podnet",
        IMAGE,
        "sh",
        "-c",
        f"echo hello | nc -w 3 {ip} {port}",
        check=False,
        timeout=60,
    )
    return result.stdout.strip()


def listening(env: PodmanEnv, node_ns: str, container: str, port: int) -> bool:
    """Whether a TCP socket listens on ``port`` inside ``container`` (busybox netstat)."""
    shown = env.podman(node_ns, "exec", container, "netstat", "-ltn", check=False).stdout
    return any(f":{port} " in line for line in shown.splitlines())


def test_podman_containers_reach_each_other_a_cluster_pod_and_published_ports(
    cluster: Path, podman: PodmanEnv
) -> None:
    node_ns = node_record(cluster, "node1").netns
    serve = "while true; do nc -l -p 8080 -e cat; done"
    podman.podman(
        node_ns,
        "run",
        "-d",
        "--name",
        "web",
        "--network",
        "podnet",
        "-p",
        "18080:8080",
        IMAGE,
        "sh",
        "-c",
        serve,
    )
    web_ip = container_ip(podman, node_ns, "web")
    assert web_ip.startswith("10.128.0."), web_ip
    wait_for(lambda: listening(podman, node_ns, "web", 8080), 30, "web's echo server")
    assert nc_echo(podman, node_ns, web_ip, 8080) == "hello"
    target = pods.find_pod(pods._loaded(cluster), "target")
    assert nc_echo(podman, node_ns, target.ip, 8080) == "hello"
    node1_ip = node_record(cluster, "node1").ip
    other = node_record(cluster, "node2").netns
    assert tcp_echo(other, node1_ip, 18080, "mapped") == "mapped"
    veths = len(pod_veths(node_ns))
    podman.podman(node_ns, "rm", "-f", "-t", "0", "web")
    assert len(pod_veths(node_ns)) == veths - 1


def tcp_echo(namespace: str, ip: str, port: int, text: str) -> str:
    """Connect from ``namespace`` to ip:port, send ``text``, return the reply (bounded)."""
    code = (
        "import socket,sys\n"
        f"s=socket.create_connection(({ip!r},{port}),timeout=5)\n"
        f"s.sendall({text!r}.encode()+b'\\n')\n"
        "print(s.recv(100).decode().strip())\n"
    )
    result = netns.run(namespace, [sys.executable, "-c", code], timeout=20)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


MIRROR = "kubernetes.io/config.mirror"


def mirror_pods(state_dir: Path) -> list[dict[str, Any]]:
    """Every mirror Pod, over every namespace."""
    with pods.admin_api(state_dir) as api:
        items = api.list(POD)["items"]
    return [p for p in items if MIRROR in (p["metadata"].get("annotations") or {})]


def with_ip(state_dir: Path, ip: str) -> dict[str, Any] | None:
    found = [p for p in mirror_pods(state_dir) if (p.get("status") or {}).get("podIP") == ip]
    return found[0] if found else None


def test_a_podman_containers_mirror_pod_goes_with_its_del(
    cluster: Path,
    podman: PodmanEnv,
) -> None:
    """Without --name, podman picks a random name ("elegant_turing"), which it passes as
    K8S_POD_NAME: the agent makes it a valid Pod name."""
    node_ns = node_record(cluster, "node1").netns
    run = ("run", "-d", "--network", "podnet", IMAGE, "sleep", "600")
    container = podman.podman(node_ns, *run).stdout.strip()
    given = podman.podman(node_ns, "inspect", "-f", "{{.Name}}", container).stdout.strip()
    ip = container_ip(podman, node_ns, container)
    mirror = wait_for(lambda: with_ip(cluster, ip), 60, "the mirror Pod with its IP")
    assert mirror["spec"]["nodeName"] == "node1" and mirror["status"]["phase"] == "Running"
    assert dns_subdomain_problem(mirror["metadata"]["name"]) is None
    assert given.replace("_", "-") in mirror["metadata"]["name"], (given, mirror["metadata"])
    podman.podman(node_ns, "rm", "-f", "-t", "0", container)
    key = (mirror["metadata"]["namespace"], mirror["metadata"]["name"])

    def gone() -> bool:
        left = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in mirror_pods(cluster)}
        return key not in left

    wait_for(gone, 60, "the mirror Pod deleted after podman's DEL")
    time.sleep(3)  # no retried status write re-creates it
    assert gone()


def test_the_documented_podman_recipe_runs_as_written(cluster: Path, podman: PodmanEnv) -> None:
    """docs/runtimes.md's commands, run from the page: the container gets an address of
    the node's subnet, with a mirror Pod, and `podman rm` takes both away."""
    node_ns = node_record(cluster, "node1").netns
    veths = len(pod_veths(node_ns))
    seen: list[dict[str, Any]] = []

    def watch_mirror() -> None:  # the mirror Pod shows while the container runs
        while not stop.is_set():
            seen.extend(p for p in mirror_pods(cluster) if p not in seen)
            stop.wait(0.2)

    stop = threading.Event()
    watcher = threading.Thread(target=watch_mirror, daemon=True)
    watcher.start()
    try:
        variables = {**podman.variables(), "NODE_NETNS": node_ns}
        result = docsteps.run_step(RECIPE, "podman-run", variables)
    finally:
        stop.set()
        watcher.join(10)
    # run -d prints the container ID, inspect its address, rm its name.
    ip = result.stdout.split()[-2]
    with pods.admin_api(cluster) as api:
        subnet = api.get(HOST_SUBNET, None, "node1")["subnet"]
    assert ip_address(ip) in ip_network(subnet), result.stdout
    mine = [p for p in seen if (p.get("status") or {}).get("podIP") == ip]
    assert mine, f"no mirror Pod showed {ip}: {seen}"
    assert len(pod_veths(node_ns)) == veths  # the DEL took the veth
    wait_for(lambda: with_ip(cluster, ip) is None, 60, "the mirror Pod deleted after podman rm")
