"""Start a real ``podnet master`` for a test or a benchmark (``MasterProcess`` itself is
production code in ``podnet.cluster.processes``: the local cluster runs its masters with it)."""

from __future__ import annotations

from pathlib import Path

from podnet.cluster.processes import MasterProcess
from podnet.store.etcd_process import EtcdProcess

__all__ = ["MasterProcess", "launch_master"]


def launch_master(etcd: EtcdProcess, state_dir: Path, prefix: str, *args: str) -> MasterProcess:
    """Start a master on ``etcd`` with its own state dir and key prefix; wait until ready."""
    return MasterProcess(etcd.endpoint, state_dir, prefix, args=list(args)).start()
