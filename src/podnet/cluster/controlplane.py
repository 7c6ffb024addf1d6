"""The local cluster's control plane: etcd and the master as background processes.

Everything the cluster starts is written to ``state.json`` in the state directory, by
PID and port, so ``cluster down`` removes exactly that (also after a crash), and nothing
else. A PID is only signalled if its command line is still the one we started, so a
recycled PID is never hit.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from podnet.cluster.state import ClusterState
from podnet.store.etcd_process import EtcdProcess, free_port, pid_alive
from podnet.testing.processes import MasterProcess

DEFAULT_STATE_DIR = Path("/var/lib/podnet/cluster")

__all__ = ["DEFAULT_STATE_DIR", "ClusterState", "ControlPlane", "ours", "terminate"]


def ours(pid: int, needle: str) -> bool:
    """Whether ``pid`` is alive and its command line still contains ``needle``."""
    if pid <= 0 or not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return needle in cmdline


def terminate(pid: int, needle: str, timeout: float = 10.0) -> bool:
    """SIGTERM (then SIGKILL) one process we started; True if it was running."""
    if not ours(pid, needle):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not ours(pid, needle):
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return True


class ControlPlane:
    """Starts, finds and stops the etcd + master pair of a local cluster."""

    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR) -> None:
        self.state_dir = state_dir
        self.master_dir = state_dir / "master"

    @property
    def kubeconfig(self) -> Path:
        return self.master_dir / "admin.kubeconfig"

    def state(self) -> ClusterState | None:
        return ClusterState.load(self.state_dir)

    def running(self) -> bool:
        state = self.state()
        return bool(state and ours(state.etcd_pid, "etcd") and ours(state.master_pid, "podnet"))

    def up(self, plugin: str, master_args: list[str], say: object = print) -> ClusterState:
        """Start etcd and the master unless they already run; idempotent."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        state = self.state() or ClusterState(plugin=plugin)
        emit = say if callable(say) else print
        if not ours(state.etcd_pid, "etcd"):
            etcd = EtcdProcess(self.state_dir, free_port(), free_port())
            etcd.start()
            assert etcd.pid is not None
            state.etcd_pid, state.etcd_port, state.etcd_peer_port = (
                etcd.pid,
                etcd.client_port,
                etcd.peer_port,
            )
            emit(f"etcd started (pid {etcd.pid}, 127.0.0.1:{etcd.client_port})")
        else:
            emit(f"etcd already running (pid {state.etcd_pid})")
        state.save(self.state_dir)
        if not ours(state.master_pid, "podnet"):
            master = MasterProcess(
                f"127.0.0.1:{state.etcd_port}",
                self.master_dir,
                "/podnet/registry/",
                port=state.master_port or free_port(),
                args=["--network-plugin", plugin, *master_args],
            )
            master.start()
            assert master.process is not None
            state.master_pid, state.master_port = master.process.pid, master.port
            state.plugin = plugin
            emit(f"master started (pid {state.master_pid}, https://127.0.0.1:{master.port})")
        else:
            emit(f"master already running (pid {state.master_pid})")
        state.save(self.state_dir)
        return state

    def down(self, say: object = print) -> None:
        """Stop what ``up`` started, by recorded PID, and remove the state directory."""
        emit = say if callable(say) else print
        state = self.state()
        if state is None:
            emit("no cluster state found; nothing to do")
            return
        if terminate(state.master_pid, "podnet"):
            emit(f"master stopped (pid {state.master_pid})")
        if terminate(state.etcd_pid, "etcd"):
            emit(f"etcd stopped (pid {state.etcd_pid})")
        shutil.rmtree(self.state_dir, ignore_errors=True)
        emit(f"removed {self.state_dir}")
