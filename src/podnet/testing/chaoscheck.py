"""The invariants of issue 8's chaos test, read from the kernel, the switch, the disk
and the API, on either data plane (the plane's own places are read by ``planeview``).

After every crash, restart and GC, what each node holds must equal what the runtime
(``podnet.testing.chaos.Runtime``) holds live, no more and no less:

- IPAM: the reservation files under ``<node>/ipam/podnet/`` (host-local layout) name
  exactly the live sandboxes' addresses, each owned by its container; no stray file;
- links: the host-side pod veths (``pn`` + 12 hex) are exactly the live sandboxes';
- switch ports: br0's pod ports are exactly the live sandboxes' veths (linux: veths
  enslaved to ``br0``; ovs: br0's OVSDB ports, each with an ofport and its pod's identity);
- anti-spoofing: the (veth, MAC, IP) a node lets a pod send with are exactly the live
  sandboxes' (linux: the ``bridge podnet pod_ports`` elements; ovs: table 20's flows);
- flows (ovs): br0's flows are exactly the desired ones for the node, the remote nodes,
  the rule set and the live sandboxes (none left of a deleted pod, none missing);
- no address is held twice in the cluster; the Pod object of each live sandbox (when the
  API was up to create it) shows its address and node, and no other Pod object claims
  an address;
- every live sandbox reaches every other (TCP echo, bounded), once every node's data
  plane holds the rule set the API's objects compile to (isolating modes fail closed:
  a pod is reachable only once its address is recorded);
- issue 19: no orphan (a sandbox whose Pod object is gone) reaches a live sandbox, and
  none reaches it, while it still runs, wired and serving.

Each check returns a list of problems, each one line naming what differs.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from podnet import netns
from podnet.cluster import nodes
from podnet.cluster.pods import admin_api
from podnet.cluster.state import ClusterState
from podnet.dataplane.wiring import host_veth_name
from podnet.ipam.reservations import parse_owner
from podnet.testing import planeview
from podnet.testing.chaos import IFNAME, Runtime, Sandbox
from podnet.testing.echoservers import ECHO_PORT
from podnet.testing.planeview import anti_spoofing, flow_problems, pod_ports, pod_veths

NETWORK = "podnet"  # the conflist's network name: IPAM keeps <ipam dir>/<network>/
IPAM_BOOKKEEPING = ("lock", "last_reserved_ip.")
PROBE_TIMEOUT = 3.0
ORPHAN_PROBE_TIMEOUT = 1.0  # a probe that must fail: a dropped SYN is never answered
ORPHAN_PEERS = 3  # live sandboxes probed from and to each orphan
POLICY_TIMEOUT = 30.0
PROBE_WORKERS = 8
POLL = 0.05  # seconds between looks while waiting for the API or a node's policy
PAYLOAD = b"chaos-probe\n"


def _diff(what: str, found: Iterable[Any], wanted: Iterable[Any]) -> list[str]:
    found, wanted = set(found), set(wanted)
    problems = [f"{what}: leaked {sorted(map(str, found - wanted))}"] if found - wanted else []
    if wanted - found:
        problems.append(f"{what}: missing {sorted(map(str, wanted - found))}")
    return problems


def ipam_files(state_dir: Path, node: str) -> tuple[dict[str, str], list[str]]:
    """(address -> owner container ID, stray file names) of ``node``'s IPAM directory."""
    root = nodes.node_paths(state_dir, node).ipam_dir / NETWORK
    held, strays = {}, []
    for path in sorted(root.iterdir()) if root.exists() else []:
        try:
            IPv4Address(path.name)
        except ValueError:
            if not path.name.startswith(IPAM_BOOKKEEPING):
                strays.append(path.name)
            continue
        held[path.name] = parse_owner(path.read_bytes().decode(errors="replace"))[0]
    return held, strays


def sandbox_mac(ip: str) -> str:
    """The pod MAC podnet derives from an address: ``0a:58:`` + the four bytes."""
    return "0a:58:" + ":".join(f"{b:02x}" for b in IPv4Address(ip).packed)


def node_problems(
    state_dir: Path, state: ClusterState, node: str, live: list[Sandbox]
) -> list[str]:
    """IPAM files, veths, switch ports, anti-spoofing entries and (ovs) flows of ``node``
    against ``live``."""
    held, strays = ipam_files(state_dir, node)
    problems = [f"{node} IPAM: stray files {strays}"] if strays else []
    problems += _diff(
        f"{node} IPAM reservations", held.items(), {(s.ip, s.container_id) for s in live}
    )
    wanted = {host_veth_name(s.container_id, IFNAME) for s in live}
    problems += _diff(f"{node} pod veths", pod_veths(state.nodes[node].netns), wanted)
    problems += _diff(f"{node} pod ports on br0", pod_ports(state_dir, state, node), wanted)
    entries = {(host_veth_name(s.container_id, IFNAME), sandbox_mac(s.ip), s.ip) for s in live}
    found = anti_spoofing(state_dir, state, node)
    problems += _diff(f"{node} anti-spoofing entries", found, entries)
    pods = [(s.container_id, IFNAME, IPv4Address(s.ip)) for s in live]
    return problems + flow_problems(state_dir, state, node, pods)


def duplicate_problems(live: list[Sandbox]) -> list[str]:
    """Addresses held by more than one live sandbox, anywhere in the cluster."""
    counts = Counter(s.ip for s in live)
    return [f"address {ip} held by {n} sandboxes" for ip, n in counts.items() if n > 1]


def agent_problems(state_dir: Path, state: ClusterState) -> list[str]:
    """Agents that died or do not answer CNI STATUS."""
    problems = []
    for name, node in state.nodes.items():
        if node.agent is None or not node.agent.alive():
            problems.append(f"agent of {name} is not running")
        elif not nodes.socket_answers(nodes.node_paths(state_dir, name).socket):
            problems.append(f"agent of {name} does not answer CNI STATUS")
    return problems


def api_problems(pod_objects: list[dict[str, Any]], live: list[Sandbox]) -> list[str]:
    """Pod objects against the live sandboxes: same address and node for each live one,
    and no address shown by any other Pod object or by two."""
    by_name = {p["metadata"]["name"]: p for p in pod_objects}
    problems = []
    for s in (s for s in live if s.has_object):
        pod = by_name.get(s.name)
        status = (pod or {}).get("status") or {}
        node = ((pod or {}).get("spec") or {}).get("nodeName")
        if pod is None or status.get("podIP") != s.ip or node != s.node:
            shown = f"{status.get('podIP')} on {node}" if pod else "no Pod object"
            problems.append(f"API: pod {s.name} shows {shown}, runs {s.ip} on {s.node}")
    live_names = {s.name for s in live}
    shown_ips = Counter((p.get("status") or {}).get("podIP") for p in pod_objects)
    for pod in pod_objects:
        ip = (pod.get("status") or {}).get("podIP")
        if ip and pod["metadata"]["name"] not in live_names:
            problems.append(f"API: deleted pod {pod['metadata']['name']} still shows {ip}")
        elif ip and shown_ips[ip] > 1:
            problems.append(f"API: {shown_ips[ip]} Pod objects show {ip}")
    return problems


def wait_api_agrees(state_dir: Path, runtime: Runtime, timeout: float) -> list[str]:
    """Poll until the API agrees with the live sandboxes (deleting the Pod objects of
    deleted sandboxes, as a kubelet does); the last disagreement after ``timeout``."""
    from podnet.model.kinds import POD

    live = runtime.snapshot()
    deadline = time.monotonic() + timeout
    with admin_api(state_dir) as api:
        while True:
            runtime.delete_pod_objects(api)
            objects = api.list(POD, namespace=runtime.pod_namespace)["items"]
            problems = api_problems(objects, live)
            if not problems or time.monotonic() > deadline:
                return problems
            time.sleep(POLL)


def tcp_echo(source: Sandbox, destination: Sandbox, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether ``destination``'s echo answers a connection from inside ``source``."""
    with netns.entered(source.netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((destination.ip, ECHO_PORT))
        sock.sendall(PAYLOAD)
        got = b""
        while len(got) < len(PAYLOAD):
            chunk = sock.recv(len(PAYLOAD) - len(got))
            if not chunk:
                break
            got += chunk
        return got == PAYLOAD
    except OSError:
        return False
    finally:
        sock.close()


def reachability_problems(live: list[Sandbox]) -> list[str]:
    """Every ordered pair of live sandboxes, TCP echo; the pairs that failed."""
    pairs = [(a, b) for a in live for b in live if a is not b]
    with ThreadPoolExecutor(PROBE_WORKERS) as pool:
        results = list(pool.map(lambda pair: tcp_echo(*pair), pairs))
    return [
        f"{a.name} ({a.ip}, {a.node}) cannot reach {b.name} ({b.ip}, {b.node})"
        for (a, b), ok in zip(pairs, results, strict=True)
        if not ok
    ]


def policy_problems(state_dir: Path, timeout: float = POLICY_TIMEOUT) -> list[str]:
    """Wait until every node's data plane holds the rule set the API's objects compile
    to; the nodes still behind after ``timeout``."""
    from podnet.policy.trace import fetch_objects

    deadline = time.monotonic() + timeout
    while True:
        state = ClusterState.load(state_dir)
        assert state is not None
        with admin_api(state_dir) as api:
            rules = fetch_objects(api).ruleset()
        late = planeview.policy_behind(state_dir, state, rules)
        if not late:
            return []
        if time.monotonic() > deadline:
            return [f"policy of {late} still differs from the API's after {timeout}s"]
        time.sleep(POLL)


def orphan_problems(state_dir: Path, runtime: Runtime) -> list[str]:
    """Issue 19: once the nodes hold the API's rule set, no orphan reaches a live sandbox
    and no live sandbox reaches an orphan (up to ``ORPHAN_PEERS`` of each, TCP echo)."""
    orphans = list(runtime.orphans.values())
    if not orphans:
        return []
    problems = policy_problems(state_dir)
    live = runtime.snapshot()[:ORPHAN_PEERS]
    pairs = [(o, p) for o in orphans for p in live] + [(p, o) for o in orphans for p in live]
    # All at once: each probe that holds lasts its whole timeout (a dropped SYN).
    with ThreadPoolExecutor(max(len(pairs), 1)) as pool:
        results = list(
            pool.map(lambda pair: tcp_echo(pair[0], pair[1], ORPHAN_PROBE_TIMEOUT), pairs)
        )
    return problems + [
        f"{a.name} ({a.ip}) reaches {b.name} ({b.ip}), but the Pod object of "
        f"{a.name if a in orphans else b.name} is gone"
        for (a, b), ok in zip(pairs, results, strict=True)
        if ok
    ]


def leak_problems(state_dir: Path, runtime: Runtime) -> list[str]:
    """IPAM files, veths, switch ports, anti-spoofing entries and (ovs) flows of every
    node against the live sandboxes."""
    state = ClusterState.load(state_dir)
    assert state is not None
    live = runtime.snapshot()
    problems = []
    for name in state.nodes:
        problems += node_problems(state_dir, state, name, [s for s in live if s.node == name])
    return problems


def api_side_problems(state_dir: Path, runtime: Runtime, api_timeout: float = 30.0) -> list[str]:
    """Agents that do not answer, addresses held twice, and the API's Pod objects against
    the live sandboxes (waited for up to ``api_timeout``)."""
    state = ClusterState.load(state_dir)
    assert state is not None
    problems = agent_problems(state_dir, state) + duplicate_problems(runtime.snapshot())
    return problems + wait_api_agrees(state_dir, runtime, api_timeout)


def node_side_problems(state_dir: Path, runtime: Runtime) -> list[str]:
    """What every node holds against the live sandboxes, then, once every node holds the
    API's rule set, reachability between them."""
    problems = leak_problems(state_dir, runtime) + policy_problems(state_dir)
    return problems + reachability_problems(runtime.snapshot())


def check_all(state_dir: Path, runtime: Runtime, api_timeout: float = 30.0) -> list[str]:
    """Every invariant; the problems found (empty when all hold)."""
    problems = api_side_problems(state_dir, runtime, api_timeout)
    return problems + node_side_problems(state_dir, runtime)
