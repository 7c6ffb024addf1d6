"""Start a real ``podnet master`` for a test or a benchmark (``MasterProcess`` itself is
production code in ``podnet.cluster.processes``: the local cluster runs its masters with it),
the command line of a ``podnet controllers`` process that reaches it over HTTPS with the
controllers' own identity, and stop
such a process by its PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from podnet.cluster.processes import MasterProcess
from podnet.master import controllers_credentials
from podnet.store.etcd_process import EtcdProcess

__all__ = ["MasterProcess", "controllers_command", "launch_master", "stop_process"]


def launch_master(etcd: EtcdProcess, state_dir: Path, prefix: str, *args: str) -> MasterProcess:
    """Start a master on ``etcd`` with its own state dir and key prefix; wait until ready."""
    return MasterProcess(etcd.endpoint, state_dir, prefix, args=list(args)).start()


def controllers_command(master: MasterProcess, work_dir: Path, *args: str) -> list[str]:
    """``podnet controllers`` reaching ``master`` over HTTPS as the controllers' own
    identity (group ``system:podnet:controllers``; token and CA written to
    ``work_dir/token`` and ``work_dir/ca.pem``), then ``args``."""
    token_file, ca_file = work_dir / "token", work_dir / "ca.pem"
    controllers_credentials(master.state_dir, "test", token_file, ca_file)
    return [
        *(sys.executable, "-m", "podnet", "controllers", "--server", master.server),
        *("--token-file", str(token_file), "--certificate-authority", str(ca_file), *args),
    ]


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID if it still runs; SIGKILL if it has not exited within 15 s."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
