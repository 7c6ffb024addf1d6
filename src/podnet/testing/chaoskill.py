"""Crash and revive one part of the local cluster, for issue 8's chaos test.

A ``Victim`` is the agent of a node, the master or the etcd member, and on the ovs data
plane also a node's ``ovsdb-server`` or ``ovs-vswitchd`` (``ovschaos``). ``kill`` sends
SIGKILL to its recorded PID (only if that PID still runs the recorded command), as a
crash would; ``restart`` starts it the way ``podnet cluster up`` does (same ports, same
data), or for an OVS daemon lets the node's agent bring it back, and returns once
readiness is signalled (see ``restart``).
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from podnet.cluster import nodes
from podnet.cluster.controlplane import ControlPlane
from podnet.cluster.pods import admin_api
from podnet.cluster.state import ClusterState, wait_exited
from podnet.store.etcd_process import health, pid_alive
from podnet.testing import ovschaos
from podnet.testing.chaos import load_state
from podnet.testing.e2e import wait_for


@dataclass(frozen=True)
class Victim:
    """What to crash: ``agent`` of ``node``, ``master`` ``index`` or ``etcd`` member
    ``index`` (0-based, as the control plane counts them), or an OVS daemon of ``node``
    (the kind is the daemon's name: ``ovsdb-server``, ``ovs-vswitchd``)."""

    kind: str
    node: str = ""
    index: int = 0

    def __str__(self) -> str:
        if self.node:
            return f"{self.kind} of {self.node}"
        return f"{self.kind} {self.index + 1}"


def victims(state: ClusterState) -> list[Victim]:
    """Every process of the cluster that the chaos test may crash (the OVS daemons on
    the ovs data plane)."""
    agents = [Victim("agent", name) for name in sorted(state.nodes)]
    masters = [Victim("master", index=i) for i in range(max(len(state.masters), 1))]
    members = [Victim("etcd", index=i) for i in range(max(len(state.etcd_members), 1))]
    switches = [
        Victim(d, name) for d in plane_kinds(state.dataplane) for name in sorted(state.nodes)
    ]
    return agents + masters + members + switches


KINDS = ("agent", "master", "etcd")


def plane_kinds(dataplane: str) -> tuple[str, ...]:
    """The kinds of victim a node has besides its agent on ``dataplane``."""
    return ovschaos.KINDS if dataplane == "ovs" else ()


def pick(rng: random.Random, state: ClusterState, kinds: Sequence[str] = KINDS) -> Victim:
    """A victim: first the kind (of ``kinds``) evenly, then which one."""
    kind = rng.choice(list(kinds))
    return rng.choice([v for v in victims(state) if v.kind == kind])


def kill(state_dir: Path, victim: Victim) -> int:
    """SIGKILL the victim by its recorded PID (only if it still is that process) and wait
    until it is gone; return the PID."""
    control = ControlPlane(state_dir)
    if victim.kind in ovschaos.KINDS:
        pid = ovschaos.kill(state_dir, victim.node, victim.kind)
    elif victim.kind == "agent":
        agent = load_state(state_dir).nodes[victim.node].agent
        pid = agent.pid if agent is not None and agent.alive() else 0
        if agent is not None and pid:
            agent.stop(timeout=0, sig=signal.SIGKILL)
    elif victim.kind == "master":
        pid = control.kill_master(victim.index)
    else:
        pid = control.kill_member(victim.index)
    if not pid:
        raise RuntimeError(f"{victim} was not running before the kill")
    wait_exited(pid)
    return pid


def restart(state_dir: Path, victim: Victim, timeout: float = 90.0) -> None:
    """Start the victim again as ``podnet cluster up`` would (same ports, same data), and
    wait for its signal: an agent's CNI STATUS and Node Ready; a master's readiness as
    the control plane defines it (/leaderz when it must lead, /healthz when another
    master runs); an etcd member's health. Then the API must serve (a pod list through
    the masters, which reads etcd) and every agent must answer CNI STATUS. An OVS daemon
    is the agent's to restart: it must run again and (``ovs-vswitchd``) br0 must hold
    its flows again (``ovschaos.wait_back``); then every agent must answer CNI STATUS."""
    state = load_state(state_dir)
    if victim.kind in ovschaos.KINDS:
        ovschaos.wait_back(state_dir, victim.node, victim.kind, timeout)
        for name in state.nodes:
            wait_agent_status(state_dir, name, timeout)
        return
    if victim.kind == "agent":
        node = state.nodes[victim.node]
        nodes.start_agent(state, node, state_dir)
        with admin_api(state_dir) as api:
            nodes.wait_agent_ready(node, state_dir, api, timeout)
        return
    control = ControlPlane(state_dir)
    if victim.kind == "etcd":
        control.restart_member(victim.index, say=_quiet)
        wait_member_healthy(state_dir, control, victim.index, timeout)
    else:
        control.restart_master(victim.index, say=_quiet)
    wait_api_serves(state_dir, timeout)
    for name in state.nodes:
        wait_agent_status(state_dir, name, timeout)


def wait_member_healthy(state_dir: Path, control: ControlPlane, index: int, timeout: float) -> None:
    """Until etcd member ``index`` reports health; fail at once, with its log, if the
    restarted process exits instead (a port taken, a data directory it refuses)."""
    member = load_state(state_dir).etcd_members[index]
    url = f"https://127.0.0.1:{member.client_port}"
    deadline = time.monotonic() + timeout
    while not health(url, control.etcd_tls(), timeout=1.0):
        log = state_dir / member.name / "etcd.log"
        if member.process is None or not pid_alive(member.process.pid):
            raise RuntimeError(
                f"etcd {member.name} exited after its restart:\n{nodes.log_tail(log)}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"etcd {member.name} at {url} not healthy within {timeout}s:\n{nodes.log_tail(log)}"
            )
        time.sleep(0.1)


def _quiet(_line: str) -> None:
    pass


def wait_api_serves(state_dir: Path, timeout: float) -> None:
    """Until the API answers a pod list (read from etcd) with the admin token."""
    from podnet.client import ClientError
    from podnet.model.kinds import POD
    from podnet.testing.chaos import quick_api

    deadline = time.monotonic() + timeout
    while True:
        try:
            with quick_api(state_dir) as api:
                api.list(POD, namespace="default")
            return
        except (ClientError, OSError) as exc:
            if time.monotonic() > deadline:
                log = nodes.log_tail(state_dir / "master" / "master.log")
                raise TimeoutError(f"the API does not serve ({exc}); master log:\n{log}") from exc
        time.sleep(0.05)


def wait_master_ready(state_dir: Path, timeout: float) -> None:
    """Until a master's /leaderz answers 200: the leader, its controllers synced."""
    import ssl
    import urllib.request

    state = load_state(state_dir)
    ports = [m.port for m in state.masters] or [state.master_port]
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE

    def ready(port: int) -> bool:
        url = f"https://127.0.0.1:{port}/leaderz"
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as resp:
                return bool(resp.status == 200)
        except OSError:  # refused, or an HTTP error status such as 503
            return False

    what = "a master's /leaderz to answer 200"
    wait_for(lambda: any(ready(port) for port in ports), timeout, what, interval=0.05)


def wait_agent_status(state_dir: Path, node: str, timeout: float) -> None:
    """Until ``node``'s agent answers CNI STATUS with success."""
    socket_path = nodes.node_paths(state_dir, node).socket
    what = f"the agent of {node} to answer STATUS"
    wait_for(lambda: nodes.socket_answers(socket_path), timeout, what, interval=0.05)


@contextlib.contextmanager
def seeded(seed: int | None = None) -> Iterator[tuple[int, random.Random]]:
    """A seed (``PODNET_CHAOS_SEED`` or fresh) and its RNG; the seed is printed first."""
    if seed is None:
        seed = int(os.environ.get("PODNET_CHAOS_SEED") or secrets.randbits(32))
    print(f"chaos seed {seed} (rerun with PODNET_CHAOS_SEED={seed})", flush=True)
    yield seed, random.Random(seed)
