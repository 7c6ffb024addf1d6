"""Chaos: SIGKILL of a node agent, a master or an etcd member at a random point of pod
ADD/DEL churn, again and again, on a real 2-node cluster (3 etcd members with TLS, 2
masters, agents in node namespaces, the real CNI shim, the real kernel). Issue 8's
acceptance point. On the ovs data plane (``PODNET_TEST_DATAPLANE=ovs``) a node's
``ovsdb-server`` and ``ovs-vswitchd`` are victims too: the agent must bring them back.

Each iteration picks a victim with a seeded RNG (the seed is printed; rerun one with
``PODNET_CHAOS_SEED``), starts churn on both nodes, kills the victim at a random moment
of it, restarts it as ``podnet cluster up`` would and waits for its readiness signal,
stops the churn, retries the DELs that failed (a runtime must), runs a CNI GC on each
node with the runtime's live attachments, and checks: no leaked or missing IPAM
reservation, host veth, switch port or anti-spoofing entry on any node, on ovs no stale or
missing flow (br0 against the desired flows), no address held twice, the API's Pod
objects agree, and every live pod reaches every other over TCP.

``PODNET_CHAOS_ITERATIONS`` sets the count (default 100), ``PODNET_CHAOS_VICTIMS`` the
kinds of victim (default ``agent,master,etcd``, and ``ovsdb-server,ovs-vswitchd`` on
ovs), ``PODNET_CHAOS_ETCD_MEMBERS`` and
``PODNET_CHAOS_MASTERS`` the control plane (default 3 and 2). Everything is removed at the
end, also on failure: the sandboxes by exact namespace name, the cluster by its state.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from podnet import netns
from podnet.cluster import lifecycle, nodes
from podnet.cluster.pods import admin_api
from podnet.cluster.state import ClusterState
from podnet.dataplane.ovs.pipeline import pod_cookie
from podnet.dataplane.wiring import host_veth_name
from podnet.testing import planeview
from podnet.testing.chaos import IFNAME, Churn, Runtime, Sandbox
from podnet.testing.chaoscheck import (
    api_side_problems,
    check_all,
    leak_problems,
    node_side_problems,
    orphan_problems,
    wait_api_agrees,
)
from podnet.testing.chaoskill import KINDS as CONTROL_KINDS
from podnet.testing.chaoskill import (
    Victim,
    kill,
    pick,
    plane_kinds,
    restart,
    seeded,
    wait_master_ready,
)
from podnet.testing.e2e import TEST_DATAPLANE, wait_for
from podnet.testing.e2e import load_state as load

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(1500)]

NODES = 2
PODS_PER_NODE = 2
CHURN_WINDOW = 1.2  # seconds: the kill lands at a random moment of this much churn
ITERATIONS = int(os.environ.get("PODNET_CHAOS_ITERATIONS") or 100)
DEFAULT_KINDS = ",".join((*CONTROL_KINDS, *plane_kinds(TEST_DATAPLANE)))
KINDS = (os.environ.get("PODNET_CHAOS_VICTIMS") or DEFAULT_KINDS).split(",")
MAX_FAILURES = 5  # failing iterations before giving up (each is reported)
ETCD_MEMBERS = int(os.environ.get("PODNET_CHAOS_ETCD_MEMBERS") or 3)
MASTERS = int(os.environ.get("PODNET_CHAOS_MASTERS") or 2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 2-node vxlan cluster; down at the end, checked to leave no namespace."""
    state_dir = tmp_path_factory.mktemp("pn-chaos")
    try:
        spec = lifecycle.ClusterSpec(
            nodes=NODES,
            etcd_members=ETCD_MEMBERS,
            masters=MASTERS,
            dataplane=TEST_DATAPLANE,
            plugin="multitenant",
        )
        lifecycle.cluster_up(state_dir, spec, say=print)
        yield state_dir
    finally:
        state = ClusterState.load(state_dir)
        lifecycle.cluster_down(state_dir, say=print)
        left = [n for n in (state.namespaces if state else []) if netns.exists(n)]
        assert not left, f"namespaces left behind: {left}"


@pytest.fixture
def runtime(cluster: Path) -> Iterator[Runtime]:
    """The runtime of both nodes; every sandbox it made is removed at the end."""
    chaos_runtime = Runtime(cluster)
    try:
        yield chaos_runtime
    finally:
        chaos_runtime.close()
        left = [n for n in chaos_runtime.made if netns.exists(n)]
        assert not left, f"sandbox namespaces left behind: {left}"


def logs(state_dir: Path) -> str:
    """The tail of every agent's, master's and etcd member's log, for a failure report."""
    state = ClusterState.load(state_dir)
    names = sorted(state.nodes) if state else []
    logs = [nodes.node_paths(state_dir, n).agent_log for n in names]
    logs += sorted((state_dir / "master").glob("master*.log"))
    logs += sorted(state_dir.glob("etcd*/etcd.log"))
    return "\n".join(f"--- {log}\n{nodes.log_tail(log)}" for log in logs)


def iteration(
    state_dir: Path,
    runtime: Runtime,
    victim: Victim,
    kill_at: float,
    rng: random.Random,
    number: int = 0,
) -> list[str]:
    """One crash during churn, then restart, DEL retries, GC; the invariants' problems."""
    names = sorted(load(state_dir).nodes)
    problems = orphan_some(state_dir, runtime, names, number, rng)
    churn = Churn(runtime, names, rng)
    with churn:
        churn.halt.wait(kill_at)  # the kill point: a random moment of the churn
        kill(state_dir, victim)
        try:
            restart(state_dir, victim)
        except (RuntimeError, TimeoutError, AssertionError) as exc:  # wait_for: Assertion
            return [f"restart failed: {exc}"]
    problems += churn.errors + runtime.retry_deletes()
    # Not a failure (GC is the runtime's remedy), but worth knowing: what only GC fixed.
    runtime.stats["differences left for GC"] += len(leak_problems(state_dir, runtime))
    for name in names:
        answer = runtime.gc(name)
        if not answer.ok:
            problems.append(f"GC on {name} failed: {answer.text.strip()}")
    with ThreadPoolExecutor(1) as pool:  # the orphans' probes must time out: meanwhile,
        orphaned = pool.submit(orphan_problems, state_dir, runtime)  # the API side
        problems += api_side_problems(state_dir, runtime)
        problems += orphaned.result()
    problems += runtime.release_orphans()
    return problems + node_side_problems(state_dir, runtime)


def orphan_some(
    state_dir: Path, runtime: Runtime, names: list[str], number: int, rng: random.Random
) -> list[str]:
    """Every other iteration a live sandbox's Pod object force-deleted, every tenth a
    namespace holding a sandbox deleted; the sandboxes run on (issue 19)."""
    problems = []
    live = runtime.snapshot()
    if number % 2 == 0 and live:
        runtime.orphan(rng.choice(live))
    if number % 10 == 5:
        with admin_api(state_dir) as api:
            problem = runtime.orphan_by_namespace(rng.choice(names), api)
        problems += [problem] if problem else []
    return problems


def reset(state_dir: Path, runtime: Runtime) -> list[str]:
    """After a failed iteration: DEL every sandbox and GC, so the next iteration starts
    clean instead of reporting the same difference again; what still differs."""
    for sandbox in runtime.snapshot():
        runtime.delete(sandbox)
    problems = runtime.release_orphans() + runtime.retry_deletes()
    for name in sorted(load(state_dir).nodes):
        runtime.gc(name)
    return problems + leak_problems(state_dir, runtime)


def test_sigkill_during_churn_leaks_nothing_and_pods_keep_talking(
    cluster: Path, runtime: Runtime
) -> None:
    names = sorted(load(cluster).nodes)
    for name in names:
        for _ in range(PODS_PER_NODE):
            assert runtime.add(name) is not None, f"initial ADD on {name} failed"
    before = check_all(cluster, runtime)
    assert not before, "\n".join(before)
    failures: list[str] = []
    started = time.monotonic()
    with seeded() as (seed, rng):
        for i in range(1, ITERATIONS + 1):
            victim = pick(rng, load(cluster), KINDS)
            kill_at = round(rng.uniform(0.05, CHURN_WINDOW), 3)
            t0 = time.monotonic()
            problems = iteration(cluster, runtime, victim, kill_at, rng, i)
            took = time.monotonic() - t0
            print(f"iteration {i}: {victim} killed at {kill_at}s; {took:.1f}s", flush=True)
            if not problems:
                continue
            report = "\n  ".join(problems)
            failures.append(f"iteration {i}, victim {victim}, killed at {kill_at}s:\n  {report}")
            print(f"FAILED {failures[-1]}\n{logs(cluster)}", flush=True)
            broken = any(p.startswith("restart failed") for p in problems) or reset(
                cluster, runtime
            )
            if broken or len(failures) >= MAX_FAILURES:
                break
    elapsed = time.monotonic() - started
    print(f"{i} iterations in {elapsed:.0f}s; operations: {dict(runtime.stats)}")
    assert not failures, (
        f"{len(failures)} of {i} iterations failed (seed {seed}; see the logs printed):\n"
        + "\n".join(failures)
    )
    wait_master_ready(cluster, 60)  # the controllers too, once the last lease is out


def test_pod_ip_reaches_the_api_when_the_agent_dies_right_after_add(
    cluster: Path, runtime: Runtime
) -> None:
    """Found by the chaos run: the agent answers ADD, then writes the Pod's IP in the
    background; SIGKILLed in between, the restarted agent keeps the pod (attached and
    healthy) but never writes its IP, so the API shows the running pod without one."""
    agent = Victim("agent", "node1")
    for attempt in range(1, 6):
        sandbox = runtime.add("node1")
        assert sandbox is not None and sandbox.has_object, runtime.stats
        kill(cluster, agent)  # as soon as the runtime has the ADD result
        restart(cluster, agent)
        problems = wait_api_agrees(cluster, runtime, timeout=20)
        assert not problems, f"attempt {attempt}: " + "\n".join(problems)


def test_the_checks_see_a_lost_pod_a_pod_never_wired_and_lost_flows(
    cluster: Path, runtime: Runtime
) -> None:
    """The invariants can fail, on either plane: a pod the runtime forgot (its DEL lost)
    shows as leaked wherever the node holds it, on ovs its flows as stale; a sandbox the
    node never wired shows as missing; on ovs, a pod whose flows were deleted behind the
    agent's back shows its flows as missing."""
    lost, kept = runtime.add("node1"), runtime.add("node1")
    assert lost is not None and kept is not None, runtime.stats
    assert not leak_problems(cluster, runtime)
    with runtime.lock:
        del runtime.live[lost.container_id]
    leaked = leak_problems(cluster, runtime)
    with runtime.lock:
        runtime.live[lost.container_id] = lost
    what = ["IPAM reservations", "pod veths", "pod ports on br0", "anti-spoofing entries"]
    veth = host_veth_name(lost.container_id, IFNAME)
    for label in what:
        assert any(p.startswith(f"node1 {label}: leaked") for p in leaked), (label, leaked)
    assert all(lost.ip in p or veth in p or "flow(s)" in p for p in leaked), leaked
    stale = [p for p in leaked if p.startswith("node1 br0: ") and "stale flow(s)" in p]
    assert len(stale) == (TEST_DATAPLANE == "ovs"), leaked
    assert not [p for p in leaked if "missing" in p], leaked

    ghost = Sandbox("ghost", "node1", "ghost", "f" * 64, "10.128.1.250")
    with runtime.lock:
        runtime.live[ghost.container_id] = ghost
    missing = leak_problems(cluster, runtime)
    with runtime.lock:
        del runtime.live[ghost.container_id]
    for label in what:
        assert any(p.startswith(f"node1 {label}: missing") for p in missing), (label, missing)
    assert len(missing) == len(what), missing  # no flows without a port to render them for

    if TEST_DATAPLANE == "ovs":
        key = pod_cookie(f"{kept.container_id}/{IFNAME}")
        planeview.ofctl(cluster, "node1", "del-flows", "br0", f"cookie={key:#x}/-1")
        gone = leak_problems(cluster, runtime)
        assert any("missing flow(s)" in p for p in gone), gone
        assert any(p.startswith("node1 anti-spoofing entries: missing") for p in gone), gone
    assert runtime.delete(kept)  # the agent deletes by cookie: gone or not, all fine after
    assert not leak_problems(cluster, runtime)


ADDS_IN_FLIGHT = 4


def ovs_daemon_killed_while_pods_are_added_comes_back_and_converges(
    cluster: Path, runtime: Runtime, daemon: str
) -> None:
    """SIGKILL of node1's ``ovsdb-server`` or ``ovs-vswitchd`` once the first of several
    concurrent ADDs has its port on br0 (the others in flight): the agent starts the
    daemon again (after ``ovs-vswitchd``, programs the new switch), the runtime DELs what
    failed, and then nothing is leaked or missing, flows included, and every pod talks."""
    for _ in range(PODS_PER_NODE):  # pods that live through the crash, on both nodes
        for name in sorted(load(cluster).nodes):
            assert runtime.add(name) is not None, f"initial ADD on {name} failed"
    state = load(cluster)
    before = len(planeview.pod_ports(cluster, state, "node1"))
    victim = Victim(daemon, "node1")
    with ThreadPoolExecutor(ADDS_IN_FLIGHT) as pool:
        adds = [pool.submit(runtime.add, "node1") for _ in range(ADDS_IN_FLIGHT)]

        def grown() -> bool:
            return len(planeview.pod_ports(cluster, state, "node1")) > before

        wait_for(grown, 60, "a new pod port on node1's br0", interval=0.01)
        assert kill(cluster, victim)
        added = [future.result() for future in adds]
    restart(cluster, victim)
    print(f"{sum(a is not None for a in added)} of {ADDS_IN_FLIGHT} ADDs ok; {runtime.stats}")
    problems = runtime.retry_deletes()
    for name in sorted(load(cluster).nodes):
        answer = runtime.gc(name)
        assert answer.ok, f"GC on {name}: {answer.text}"
    problems += check_all(cluster, runtime)
    assert not problems, "\n".join(problems) + "\n" + logs(cluster)


if TEST_DATAPLANE == "ovs":  # the OVS daemons exist only on the ovs data plane (no skip)
    test_ovs_daemon_killed_while_pods_are_added_comes_back_and_converges = pytest.mark.parametrize(
        "daemon", plane_kinds("ovs")
    )(ovs_daemon_killed_while_pods_are_added_comes_back_and_converges)
