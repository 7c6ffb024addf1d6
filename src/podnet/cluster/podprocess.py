"""A local-cluster pod's processes: started inside its network namespace and a sandbox of
its own (``podnet.cluster.sandbox``), recorded by the host PID of the command itself;
commands run inside a running pod; the pod's processes stopped, all of them."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from podnet import netns
from podnet.cluster.podresolv import netns_etc_dir
from podnet.cluster.poduids import PodUidError, claimed
from podnet.cluster.podvolumes import Volume
from podnet.cluster.sandbox import (
    ROOT,
    Sandbox,
    exec_argv,
    hidden_paths,
    interpreter_paths,
    pod_environment,
    process_ids,
)
from podnet.cluster.state import PodRecord, ProcessRecord, proc_cmdline, wait_exited

__all__ = [
    "PodProcessError",
    "exec_command",
    "pod_environment",
    "pod_sandbox",
    "process_ids",
    "spawn_in_pod",
    "start_command",
    "stop_pod_processes",
]
REPORT_TIMEOUT = 30.0


class PodProcessError(Exception):
    """A pod's process could not be started (the message says why)."""


def pod_sandbox(
    state_dir: Path, privileged: bool = False, netns_name: str = "", uid: int | None = None
) -> Sandbox:
    """The sandbox of this cluster's pods: its state dir and podnet's defaults hidden;
    ``uid`` (as uid and gid: ``podnet.cluster.poduids``), or root when ``privileged``; the
    files of the pod namespace's ``/etc/netns/<netns_name>`` (its resolv.conf), when there
    are any, over /etc's."""
    if privileged:
        uid = ROOT
    elif uid is None or uid == ROOT:
        raise ValueError("an unprivileged pod needs a uid of its own (podnet.cluster.poduids)")
    etc = netns_etc_dir(netns_name) if netns_name else None
    etc = etc if etc is not None and etc.is_dir() else None
    return Sandbox(hidden_paths([state_dir]), uid, uid, interpreter_paths(), etc)


def _read_report(fd: int, timeout: float) -> str:
    """The line the sandbox wrote to ``fd`` (empty if it closed it first), within
    ``timeout``."""
    deadline = time.monotonic() + timeout
    data = b""
    while (left := deadline - time.monotonic()) > 0 and select.select([fd], [], [], left)[0]:
        chunk = os.read(fd, 64)
        data += chunk
        if not chunk or data.endswith(b"\n"):
            break
    return data.decode()


def spawn_in_pod(
    pod: PodRecord,
    sandbox: Sandbox,
    command: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
) -> ProcessRecord:
    """Start ``command`` in the pod's namespace and a new sandbox, in the background,
    output to ``log_path``, with ``env`` added to the pod environment (the service
    variables); recorded once it has exec'd (by the command's host PID)."""
    final = " ".join(command) + " "
    log_path.parent.mkdir(parents=True, exist_ok=True)
    report_r, report_w = os.pipe()
    try:
        with open(log_path, "ab") as log:
            starter = subprocess.Popen(
                sandbox.wrap(netns.path(pod.netns), command, report_w),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**(env or {}), **pod_environment()},
                pass_fds=(report_w,),
            )
        os.close(report_w)
        report = _read_report(report_r, REPORT_TIMEOUT).split()
    finally:
        os.close(report_r)
        with contextlib.suppress(OSError):
            os.close(report_w)
    starter.wait(REPORT_TIMEOUT)
    if len(report) != 2:
        raise PodProcessError(f"the sandbox of pod {pod.key} did not start; see {log_path}")
    pid = int(report[1])
    deadline = time.monotonic() + 5
    while proc_cmdline(pid) != final:
        if not proc_cmdline(pid) and not Path(f"/proc/{pid}/stat").exists():
            raise PodProcessError(f"the process of pod {pod.key} exited at once; see {log_path}")
        if time.monotonic() > deadline:
            break
        time.sleep(0.005)
    return ProcessRecord.of(pid, " ".join(command))


def start_command(
    state_dir: Path,
    pod: PodRecord,
    command: Sequence[str],
    privileged: bool,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    volumes: Sequence[Volume] = (),
) -> ProcessRecord:
    """The pod's command in a new sandbox with ``volumes`` (checked already:
    ``podnet.cluster.podvolumes``) bound in: as root when ``privileged``, else as a uid
    of its own, claimed until the command runs as it."""
    if privileged:
        sandbox = replace(pod_sandbox(state_dir, True, pod.netns), volumes=tuple(volumes))
        return spawn_in_pod(pod, sandbox, command, log_path, env)
    try:
        with claimed() as uid:
            sandbox = pod_sandbox(state_dir, False, pod.netns, uid)
            sandbox = replace(sandbox, volumes=tuple(volumes))
            return spawn_in_pod(pod, sandbox, command, log_path, env)
    except PodUidError as exc:
        raise PodProcessError(str(exc)) from exc


def exec_command(process: ProcessRecord, argv: Sequence[str]) -> list[str]:
    """``argv`` as run inside the running pod whose command is ``process``."""
    return exec_argv(process.pid, process.start, argv)


def pod_init(process: ProcessRecord) -> int:
    """A pidfd of the pod's init (PID 1 of its namespace: the command's parent), or -1."""
    from podnet.cluster.sandboxrun import pod_init as find_init
    from podnet.cluster.sandboxsys import SandboxError

    try:
        fd, _, _ = find_init(process.pid, process.start)
    except SandboxError:
        return -1
    return fd


def stop_pod_processes(process: ProcessRecord, timeout: float = 5.0) -> bool:
    """Stop the pod's command (SIGTERM, SIGKILL after ``timeout``), then make sure its
    init, and with it every other process of the pod's PID namespace, is gone (SIGKILL
    by pidfd: the very process). True if the command was running."""
    init = pod_init(process) if process.alive() else -1
    stopped = process.stop(timeout=timeout)
    if init < 0:
        return stopped
    try:
        deadline = time.monotonic() + 2
        while not select.select([init], [], [], 0.05)[0]:
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(init, signal.SIGKILL)
                select.select([init], [], [], 10)
                break
        with contextlib.suppress(TimeoutError, ValueError):
            wait_exited(_pidfd_pid(init), 5)
    finally:
        os.close(init)
    return stopped


def _pidfd_pid(fd: int) -> int:
    """The PID a pidfd refers to (``Pid:`` of its fdinfo; -1 once it exited)."""
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("Pid:"):
            return int(line.split()[1])
    raise ValueError(f"fd {fd} is not a pidfd")
