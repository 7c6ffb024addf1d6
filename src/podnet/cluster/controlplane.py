"""The local cluster's control plane: etcd members and masters as background processes.

etcd always runs with TLS and client-certificate auth (``<state>/etcd-pki``), one member
or several (``etcd1``..``etcdN`` on static loopback ports, ``--initial-cluster``). The
masters share one state directory (API PKI, etcd.json, admin kubeconfig; the tokens are
in etcd) and elect a leader for the controllers; each serves the API on its own port.
With two or more masters a relay on the root loopback (``api_port``) is the admin
kubeconfig's one server and fails over between them; node relays do the same inside each
node namespace.

Everything is written to ``state.json`` *before* it starts (ports, data directories) and
right after (PIDs), so a dead member or master is restarted with the same ports and data
(the masters' ``--etcd`` never changes), and ``cluster down`` removes exactly what was
started, also after a crash, and nothing else. A PID is only signalled if its command
line and start time are still those we recorded, so a recycled PID is never hit.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from podnet.cluster.masteraccess import advertise_args
from podnet.cluster.processes import MasterProcess
from podnet.cluster.state import (
    ClusterState,
    EtcdMemberRecord,
    MasterRecord,
    ProcessRecord,
    spawn,
    wait_exited,
)
from podnet.store.etcd_pki import EtcdPki, EtcdTls, ensure_etcd_pki
from podnet.store.etcd_process import EtcdProcess, free_port, pid_alive, wait_healthy

DEFAULT_STATE_DIR = Path("/var/lib/podnet/cluster")
REGISTRY_PREFIX = "/podnet/registry/"

__all__ = ["DEFAULT_STATE_DIR", "ClusterState", "ControlPlane", "ControlPlaneError", "ours"]

Say = Callable[[str], None]


class ControlPlaneError(Exception):
    """The control plane cannot do what was asked (the message says why)."""


def ours(pid: int, needle: str) -> bool:
    """Whether ``pid`` is alive and its command line still contains ``needle``."""
    if pid <= 0 or not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return needle in cmdline


def alive(record: ProcessRecord | None) -> bool:
    """Whether the recorded process still runs."""
    return bool(record and record.alive())


class ControlPlane:
    """Starts, finds, restarts and stops the etcd members and masters of a local cluster."""

    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR) -> None:
        self.state_dir = state_dir
        self.master_dir = state_dir / "master"
        self.etcd_pki = EtcdPki(state_dir / "etcd-pki")

    @property
    def kubeconfig(self) -> Path:
        return self.master_dir / "admin.kubeconfig"

    def state(self) -> ClusterState | None:
        return ClusterState.load(self.state_dir)

    def etcd_tls(self) -> EtcdTls:
        """The masters' etcd client certificate (also what ``cluster status`` uses)."""
        return self.etcd_pki.client_tls()

    def etcd_endpoints(self, state: ClusterState) -> str:
        """Every member's client endpoint, comma-separated, in member order."""
        return ",".join(f"127.0.0.1:{m.client_port}" for m in state.etcd_members)

    def running(self) -> bool:
        """Whether every recorded member and master runs."""
        state = self.state()
        if state is None or not state.etcd_members or not state.masters:
            return False
        members = all(alive(m.process) for m in state.etcd_members)
        return members and all(alive(m.process) for m in state.masters)

    # ---- up ------------------------------------------------------------------------------

    def up(
        self,
        plugin: str,
        master_args: list[str],
        say: Say = print,
        etcd_members: int = 0,
        masters: int = 0,
    ) -> ClusterState:
        """Start every member and master that does not run; idempotent. ``0`` means "as
        recorded, or 1". A restarted process gets its recorded ports and data."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        state = self.state() or ClusterState(plugin=plugin)
        self._plan(state, plugin, master_args, etcd_members, masters)
        state.save(self.state_dir)
        self._ensure_etcd(state, say)
        for index in range(len(state.masters)):
            self._ensure_master(state, index, say)
        self._ensure_api_relay(state, say)
        return state

    def _plan(
        self, state: ClusterState, plugin: str, args: list[str], members: int, masters: int
    ) -> None:
        """Record ports for what is asked; refuse a change of size (etcd membership and
        the relays' targets are fixed when the cluster is made)."""
        if not state.etcd_members and (state.etcd_pid or state.master_pid):
            raise ControlPlaneError(
                "this cluster was made by an older podnet (plain etcd); `podnet cluster down` first"
            )
        if state.etcd_members and members and members != len(state.etcd_members):
            raise ControlPlaneError(
                f"the cluster has {len(state.etcd_members)} etcd members; "
                f"`podnet cluster down` first to run {members}"
            )
        if state.masters and masters and masters != len(state.masters):
            raise ControlPlaneError(
                f"the cluster has {len(state.masters)} masters; "
                f"`podnet cluster down` first to run {masters}"
            )
        if not state.etcd_members:
            state.etcd_members = [
                EtcdMemberRecord(f"etcd{i}", free_port(), free_port())
                for i in range(1, (members or 1) + 1)
            ]
        if not state.masters:
            state.plugin, state.master_args = plugin, list(args)
            state.masters = [MasterRecord(j, free_port()) for j in range(1, (masters or 1) + 1)]
            if len(state.masters) > 1:
                state.api_port = free_port()
        first = state.etcd_members[0]
        state.etcd_port, state.etcd_peer_port = first.client_port, first.peer_port
        state.master_port = state.masters[0].port

    # ---- etcd ----------------------------------------------------------------------------

    def _member_process(self, state: ClusterState, index: int) -> EtcdProcess:
        member = state.etcd_members[index]
        etcd = EtcdProcess(
            self.state_dir / member.name,
            member.client_port,
            member.peer_port,
            name=member.name,
            pki=self.etcd_pki,
            cluster_token=f"podnet-{state.cluster_id or 'local'}",
        )
        etcd.initial_cluster = ",".join(
            f"{m.name}=https://127.0.0.1:{m.peer_port}" for m in state.etcd_members
        )
        return etcd

    def _ensure_etcd(self, state: ClusterState, say: Say) -> None:
        ensure_etcd_pki(self.etcd_pki.directory, {m.name: [] for m in state.etcd_members})
        for index in range(len(state.etcd_members)):
            self._start_member(state, index, say)
        # A lone member of three has no quorum: wait for health only once all started.
        first = self._member_process(state, 0)
        wait_healthy(first.client_url, self.etcd_tls(), timeout=60)

    def _start_member(self, state: ClusterState, index: int, say: Say) -> bool:
        member = state.etcd_members[index]
        if alive(member.process):
            say(f"etcd {member.name} already running (pid {_pid(member.process)})")
            return False
        etcd = self._member_process(state, index)
        etcd.start(timeout=30)
        assert etcd.pid is not None
        member.process = ProcessRecord.of(etcd.pid, f"etcd --name {member.name} ")
        if index == 0:
            state.etcd_pid = etcd.pid
        state.save(self.state_dir)
        say(f"etcd {member.name} started (pid {etcd.pid}, {etcd.client_url})")
        return True

    # ---- masters -------------------------------------------------------------------------

    def _master_process(self, state: ClusterState, index: int) -> MasterProcess:
        record = state.masters[index]
        args = ["--network-plugin", state.plugin, *state.master_args]
        args += advertise_args(state, record)  # pods reach it through default/kubernetes
        if state.api_port:
            args += ["--kubeconfig-server", f"https://127.0.0.1:{state.api_port}"]
        process = MasterProcess(
            self.etcd_endpoints(state),
            self.master_dir,
            REGISTRY_PREFIX,
            port=record.port,
            args=args,
            etcd_tls=self.etcd_tls(),
        )
        process.log_name = f"master{record.index}.log" if len(state.masters) > 1 else "master.log"
        return process

    def _ensure_master(self, state: ClusterState, index: int, say: Say) -> bool:
        record = state.masters[index]
        if alive(record.process):
            say(f"master {record.index} already running (pid {_pid(record.process)})")
            return False
        master = self._master_process(state, index)
        master.start(wait=False)
        assert master.process is not None
        record.process = ProcessRecord.of(master.process.pid, f"--listen 127.0.0.1:{record.port} ")
        if index == 0:
            state.master_pid = master.process.pid
        state.save(self.state_dir)
        # A master alone must lead (it writes the ClusterNetwork; a restarted one waits out
        # its old lease): /leaderz. The others only serve until the leader dies: /healthz.
        master.wait_ready(60, "/leaderz" if not self._another_leads(state, index) else "/healthz")
        say(f"master {record.index} started (pid {master.process.pid}, {master.server})")
        return True

    def _another_leads(self, state: ClusterState, index: int) -> bool:
        return any(alive(m.process) for i, m in enumerate(state.masters) if i != index)

    def _ensure_api_relay(self, state: ClusterState, say: Say) -> None:
        if not state.api_port or alive(state.api_relay):
            return
        argv = [sys.executable, "-m", "podnet.cluster.relay", "--port", str(state.api_port)]
        for master in state.masters:
            argv += ["--target-port", str(master.port)]
        needle = f"podnet.cluster.relay --port {state.api_port} "
        state.api_relay = spawn(argv, self.state_dir / "api-relay.log", needle)
        state.save(self.state_dir)
        _wait_listening(state.api_port, state.api_relay)
        say(f"API relay https://127.0.0.1:{state.api_port} -> masters (pid {state.api_relay.pid})")

    # ---- crash and restart (for chaos tests and operators) -------------------------------

    def kill_member(self, index: int, sig: int = signal.SIGKILL) -> int:
        """Signal etcd member ``index`` (0-based); its PID, or 0 if it was not running."""
        state = self._loaded()
        return _signal(state.etcd_members[index].process, sig)

    def restart_member(self, index: int, say: Say = print) -> bool:
        """Start member ``index`` again if it is dead, with its ports and data; True if so."""
        state = self._loaded()
        started = self._start_member(state, index, say)
        state.save(self.state_dir)
        return started

    def kill_master(self, index: int, sig: int = signal.SIGKILL) -> int:
        """Signal master ``index`` (0-based); its PID, or 0 if it was not running."""
        state = self._loaded()
        return _signal(state.masters[index].process, sig)

    def restart_master(self, index: int, say: Say = print) -> bool:
        """Start master ``index`` again if it is dead, on its port; True if so."""
        state = self._loaded()
        return self._ensure_master(state, index, say)

    def _loaded(self) -> ClusterState:
        state = self.state()
        if state is None:
            raise ControlPlaneError(f"no cluster at {self.state_dir}")
        return state

    # ---- down ----------------------------------------------------------------------------

    def down(self, say: Say = print) -> None:
        """Stop what ``up`` started, by recorded PID, and remove the state directory."""
        state = self.state()
        if state is None:
            say("no cluster state found; nothing to do")
            return
        if state.api_relay and state.api_relay.stop(timeout=5):
            say(f"API relay stopped (pid {state.api_relay.pid})")
        for master in state.masters:
            if master.process and master.process.stop(timeout=15):
                say(f"master {master.index} stopped (pid {master.process.pid})")
        for member in state.etcd_members:
            if member.process and member.process.stop(timeout=10):
                say(f"etcd {member.name} stopped (pid {member.process.pid})")
        if not state.etcd_members:  # a state written by an older podnet
            for pid, needle in ((state.master_pid, "podnet"), (state.etcd_pid, "etcd")):
                if pid and ProcessRecord(pid, needle).stop(timeout=10):
                    say(f"{needle} stopped (pid {pid})")
        shutil.rmtree(self.state_dir, ignore_errors=True)
        say(f"removed {self.state_dir}")


def _wait_listening(port: int, record: ProcessRecord, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and record.alive():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise ControlPlaneError(f"the API relay did not listen on 127.0.0.1:{port}")


def _pid(record: ProcessRecord | None) -> int:
    return record.pid if record else 0


def _signal(record: ProcessRecord | None, sig: int) -> int:
    if record is None or not record.alive():
        return 0
    os.kill(record.pid, sig)
    if sig == signal.SIGKILL:
        wait_exited(record.pid)
    return record.pid
