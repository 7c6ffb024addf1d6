"""What a local cluster created, as recorded on disk in ``state.json``.

Every namespace and process is written here *before* (namespaces) or right after
(processes) it is made, so ``cluster down`` can remove exactly that, also after a crash,
and nothing else. Names carry the cluster's random id (``pn-<id>-...``), so two clusters
on one machine never share one.

A process is identified by PID, a piece of its command line and its start time (field 22
of /proc/<pid>/stat), so a recycled PID is never signalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ID_LENGTH = 6  # hex digits: "pn-<id>-n12" still fits the 15-character link name limit


class StateFileError(ValueError):
    """``state.json`` contradicts itself (the message says how)."""


def new_cluster_id() -> str:
    """A fresh random cluster id (lowercase hex)."""
    return secrets.token_hex(ID_LENGTH // 2)


def proc_start_time(pid: int) -> int:
    """The start time of ``pid`` in clock ticks since boot, or 0 if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else 0


def process_state(pid: int) -> str:
    """The state letter of ``pid`` from /proc (``""`` if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rfind(")") + 2 :][:1]


def other_threads(pid: int) -> int:
    """How many threads of ``pid`` besides its first one are still there."""
    try:
        return sum(1 for task in os.scandir(f"/proc/{pid}/task") if task.name != str(pid))
    except OSError:
        return 0


def wait_exited(pid: int, timeout: float = 10.0) -> None:
    """Until ``pid`` has finished exiting: gone, or a zombie (reaped if it is our child).

    An empty command line is not enough: the kernel drops a dying process's memory (and
    so its cmdline) before its files, so for a moment its listening sockets still hold
    their ports and accept connections, and a restart on the same port fails to bind.
    Nor is a zombie leader: in a multi-threaded process (etcd, any Go program) the first
    thread shows ``Z`` while the others are still exiting with the files open, so it
    counts only once no other thread is left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = process_state(pid)
        if state == "" or (state == "Z" and other_threads(pid) == 0):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)  # a zombie that is our own child: reap it
            return
        time.sleep(0.005)
    raise TimeoutError(f"pid {pid} still exiting {timeout}s after it was killed")


def proc_cmdline(pid: int) -> str:
    """The command line of ``pid`` joined with spaces ('' if it is gone or a zombie)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@dataclass
class ProcessRecord:
    """One background process the cluster started."""

    pid: int
    needle: str  # a piece of its command line
    start: int = 0  # /proc start time; 0 = not checked

    @staticmethod
    def of(pid: int, needle: str) -> ProcessRecord:
        """Record ``pid`` now (its start time is read immediately)."""
        return ProcessRecord(pid, needle, proc_start_time(pid))

    def alive(self) -> bool:
        """Whether the very process we started still runs."""
        if self.pid <= 0 or self.needle not in proc_cmdline(self.pid):
            return False
        return self.start == 0 or proc_start_time(self.pid) == self.start

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> bool:
        """Signal it (SIGTERM, then SIGKILL after ``timeout``); True if it was running."""
        if not self.alive():
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                _wait_gone(self.pid)
                return True
            time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        _wait_gone(self.pid)
        return True


def _wait_gone(pid: int) -> None:
    # A process stuck in the kernel must not make ``stop`` raise: it was signalled.
    with contextlib.suppress(TimeoutError):
        wait_exited(pid)


def spawn(
    argv: Sequence[str], log_path: Path, needle: str, env: Mapping[str, str] | None = None
) -> ProcessRecord:
    """Start ``argv`` in the background, in its own session, output to ``log_path``;
    ``env`` is added to this process's environment."""
    final = " ".join(_final_argv(argv)) + " "
    if needle not in final:
        raise ValueError(f"{needle!r} is not part of the command line {final!r}")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
        )
    # nsenter execs the command in place: wait until the PID shows the command itself
    # (during the exec its command line is briefly empty), so the record is final.
    deadline = time.monotonic() + 5
    while proc_cmdline(process.pid) != final:
        if process.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited at once; see {log_path}")
        if time.monotonic() > deadline:
            break
        time.sleep(0.005)
    return ProcessRecord.of(process.pid, needle)


def _final_argv(argv: Sequence[str]) -> list[str]:
    """The command that runs in the end: what follows ``--`` of an nsenter wrapper."""
    argv = list(argv)
    if argv and Path(argv[0]).name == "nsenter" and "--" in argv:
        return argv[argv.index("--") + 1 :]
    return argv


@dataclass
class NodeRecord:
    """A node namespace with its agent and its API relay."""

    name: str
    index: int
    netns: str
    ip: str
    agent: ProcessRecord | None = None
    relay: ProcessRecord | None = None
    podwatch: ProcessRecord | None = None  # the node's pod exit watcher
    metrics_port: int = 0  # the agent's /metrics on the namespace's 127.0.0.1 (0: off)


@dataclass
class PodRecord:
    """A pod namespace wired by the CNI plugin, and the process running in it."""

    name: str
    namespace: str
    node: str
    netns: str
    container_id: str
    ip: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    process: ProcessRecord | None = None
    prober: ProcessRecord | None = None  # its readiness prober, when it has a check

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class ExternalHost:
    """The host on the underlay that is not a node (the NAT target)."""

    netns: str
    ip: str
    echo: ProcessRecord | None = None


@dataclass
class RouterRecord:
    """The router of ``cluster up --router`` (``podnet.cluster.router``): its pod (a key of
    ``ClusterState.pods``), the node address its hostPorts publish, the apps domain, and
    that domain's resolver on the external host."""

    pod: str
    node: str
    address: str
    domain: str
    dns: ProcessRecord | None = None


@dataclass
class EtcdMemberRecord:
    """One etcd member of the control plane: its ports and data never change."""

    name: str
    client_port: int
    peer_port: int
    process: ProcessRecord | None = None


@dataclass
class MasterRecord:
    """One ``podnet master``: its port never changes, so relays and kubeconfigs hold."""

    index: int
    port: int
    process: ProcessRecord | None = None
    relay: ProcessRecord | None = None  # its relay on the underlay (``masteraccess``)


def _member(data: dict[str, Any]) -> EtcdMemberRecord:
    return EtcdMemberRecord(**{**data, "process": _process(data.get("process"))})


def _master(data: dict[str, Any]) -> MasterRecord:
    relay = _process(data.get("relay"))
    return MasterRecord(**{**data, "process": _process(data.get("process")), "relay": relay})


def _process(data: Any) -> ProcessRecord | None:
    return ProcessRecord(**data) if isinstance(data, dict) else None


def _node(data: dict[str, Any]) -> NodeRecord:
    agent, relay = _process(data.pop("agent", None)), _process(data.pop("relay", None))
    podwatch = _process(data.pop("podwatch", None))
    return NodeRecord(**data, agent=agent, relay=relay, podwatch=podwatch)


def _pod(data: dict[str, Any]) -> PodRecord:
    process, prober = _process(data.pop("process", None)), _process(data.pop("prober", None))
    return PodRecord(**data, process=process, prober=prober)


def _router(data: Any) -> RouterRecord | None:
    if not isinstance(data, dict):
        return None
    return RouterRecord(**{**data, "dns": _process(data.get("dns"))})


CLUSTER_DATAPLANES = ("linux", "ovs")  # the registry names a real cluster can run


@dataclass
class ClusterState:
    """What ``cluster up`` started, as recorded on disk."""

    plugin: str = "subnet"
    etcd_pid: int = 0
    etcd_port: int = 0
    etcd_peer_port: int = 0
    master_pid: int = 0
    master_port: int = 0
    extra: dict[str, object] = field(default_factory=dict)
    cluster_id: str = ""
    tunnel: str = "vxlan"  # "backend" in state files written before issue 9
    dataplane: str = "linux"  # the agents' data plane implementation (registry name)
    underlay_cidr: str = ""
    namespaces: list[str] = field(default_factory=list)  # every netns, in creation order
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    pods: dict[str, PodRecord] = field(default_factory=dict)  # by "namespace/name"
    external: ExternalHost | None = None
    # The HA control plane (``etcd_*``/``master_*`` above mirror member 1 and master 1).
    etcd_members: list[EtcdMemberRecord] = field(default_factory=list)
    masters: list[MasterRecord] = field(default_factory=list)
    master_args: list[str] = field(default_factory=list)
    api_port: int = 0  # the admin's relay in front of several masters (0: none)
    api_relay: ProcessRecord | None = None
    dns_upstreams: list[str] = field(default_factory=list)  # empty: the host's resolvers
    router: RouterRecord | None = None  # ``cluster up --router``

    @staticmethod
    def load(state_dir: Path) -> ClusterState | None:
        """The recorded state, or None if there is no cluster at ``state_dir``."""
        path = state_dir / "state.json"
        if not path.exists():
            return None
        return ClusterState.from_dict(json.loads(path.read_text()))

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ClusterState:
        """Rebuild the nested records from their JSON form."""
        _rename_backend(data)
        nodes = {k: _node(dict(v)) for k, v in data.pop("nodes", {}).items()}
        pods = {k: _pod(dict(v)) for k, v in data.pop("pods", {}).items()}
        members = [_member(dict(m)) for m in data.pop("etcd_members", [])]
        masters = [_master(dict(m)) for m in data.pop("masters", [])]
        api_relay = _process(data.pop("api_relay", None))
        router = data.pop("router", None)
        ext = data.pop("external", None)
        external = None
        if isinstance(ext, dict):
            external = ExternalHost(ext["netns"], ext["ip"], _process(ext.get("echo")))
        return ClusterState(
            **data,
            nodes=nodes,
            pods=pods,
            external=external,
            etcd_members=members,
            masters=masters,
            api_relay=api_relay,
            router=_router(router),
        )

    def save(self, state_dir: Path) -> None:
        """Write atomically (temp file + rename)."""
        path = state_dir / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    def prefix(self) -> str:
        """The prefix of every namespace and link this cluster creates."""
        return f"pn-{self.cluster_id}"

    def record_netns(self, name: str, state_dir: Path) -> None:
        """Remember namespace ``name`` (saved before it is created)."""
        if name not in self.namespaces:
            self.namespaces.append(name)
            self.save(state_dir)


def _rename_backend(data: dict[str, Any]) -> None:
    """Read the tunnel from ``backend``, its name in older state files."""
    if "backend" not in data:
        return
    old = data.pop("backend")
    tunnel = data.setdefault("tunnel", old)
    if tunnel != old:
        raise StateFileError(
            f"state.json names two tunnels: tunnel {tunnel!r} and (older key) backend {old!r}"
        )


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Hold the cluster's lock, so concurrent ``pod run``s do not lose each other's state."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(state_dir / "state.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
