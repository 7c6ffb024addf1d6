"""A local-cluster pod's processes: started inside its network namespace and sandbox
(``podnet.cluster.sandbox``), recorded by the PID of the command itself."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from podnet import netns
from podnet.cluster.podresolv import netns_etc_dir
from podnet.cluster.sandbox import (
    NOBODY,
    ROOT,
    Sandbox,
    hidden_paths,
    interpreter_paths,
    pod_environment,
    process_ids,
)
from podnet.cluster.state import PodRecord, ProcessRecord, proc_cmdline

__all__ = ["PodProcessError", "pod_environment", "pod_sandbox", "process_ids", "spawn_in_pod"]


class PodProcessError(Exception):
    """A pod's process could not be started (the message says why)."""


def pod_sandbox(state_dir: Path, privileged: bool = False, netns_name: str = "") -> Sandbox:
    """The sandbox of this cluster's pods: its state dir and podnet's defaults hidden;
    ``nobody:nogroup``, or root when ``privileged``; the files of the pod namespace's
    ``/etc/netns/<netns_name>`` (its resolv.conf), when there are any, over /etc's."""
    ids = ROOT if privileged else NOBODY
    etc = netns_etc_dir(netns_name) if netns_name else None
    etc = etc if etc is not None and etc.is_dir() else None
    return Sandbox(hidden_paths([state_dir]), ids, ids, interpreter_paths(), etc)


def spawn_in_pod(
    pod: PodRecord,
    sandbox: Sandbox,
    command: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
) -> ProcessRecord:
    """Start ``command`` in the pod's namespace and sandbox, in the background, output to
    ``log_path``, with ``env`` added to the pod environment (the service variables);
    recorded once the wrappers have exec'd it (its PID is the command's)."""
    argv = sandbox.wrap(netns.path(pod.netns), command)
    final = " ".join(command) + " "
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**(env or {}), **pod_environment()},
        )
    deadline = time.monotonic() + 5
    while proc_cmdline(process.pid) != final:
        if process.poll() is not None:
            raise PodProcessError(f"the process of pod {pod.key} exited at once; see {log_path}")
        if time.monotonic() > deadline:
            break
        time.sleep(0.005)
    return ProcessRecord.of(process.pid, " ".join(command))
