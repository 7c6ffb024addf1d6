"""The processes of a pod sandbox, as a container runtime makes them.

``run`` starts a pod. As root on the host it enters the pod's network namespace,
unshares a mount, a PID and an IPC namespace (mounts private: nothing propagates back)
and forks the pod's *init*, PID 1 of the new PID namespace. Init sets up the pod's files
(``podnet.cluster.sandboxmounts``: secrets hidden, private ``/tmp`` and ``/dev/shm``, its
own ``/proc``), forks the *command* (PID 2), drops every capability and stays root only
to reap, so the pod's user can neither signal nor trace it. The command sends one
datagram whose credentials the kernel translates into its host PID for the starter,
drops to the pod's user and ``exec``s the pod's command in place: the host PID the
cluster records is the command's, so signals, exit statuses (the proc connector) and
pidfds work on it as on any process. When the command ends, init exits and the kernel
kills whatever else still runs in the pod's PID namespace, as with a container.

``exec_in`` runs a command in a running pod (``pod exec``, command readiness checks): it
joins the namespaces of the pod's init, found as the parent of the recorded command
(its PID and start time checked, held by pidfd), and runs as the command's user.

The pod's user (unless the pod is privileged, root) has no capabilities and a bounding
set of only ``CAP_NET_BIND_SERVICE`` and ``CAP_NET_RAW`` (so ``ping``, which has file
capabilities, still runs); ``no_new_privs`` keeps setuid and file-capability binaries from
giving any back.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from podnet.cluster.sandboxmounts import FsView, set_up
from podnet.cluster.sandboxsys import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    MS_PRIVATE,
    MS_REC,
    SandboxError,
    clear_capabilities,
    drop_bounding_set,
    last_capability,
    mount,
    no_new_privs,
    parent_death_signal,
    setns,
    unshare,
)

ROOT = 0
POD_NAMESPACES = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC
_UCRED = struct.Struct("=iII")  # pid, uid, gid
# Left in a pod user's bounding set, as Docker's defaults do: a binary with file
# capabilities the bounding set lacks fails to exec (EPERM; ping has cap_net_raw=ep), while
# no_new_privs already keeps any exec from granting them (ping then uses ICMP datagram
# sockets, allowed by the pod's ping_group_range).
CAP_NET_BIND_SERVICE, CAP_NET_RAW = 10, 13
USER_BOUNDING_SET = frozenset({CAP_NET_BIND_SERVICE, CAP_NET_RAW})
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def become(uid: int, gid: int, last_cap: int) -> None:
    """Drop to ``uid:gid`` with no supplementary groups, no capabilities (root keeps
    them: a privileged pod) and ``no_new_privs``."""
    os.setgroups([])
    if uid != ROOT:
        drop_bounding_set(last_cap, USER_BOUNDING_SET)
        os.setgid(gid)
        os.setuid(uid)
        clear_capabilities()  # setuid cleared effective and permitted; inheritable too
    no_new_privs()


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def _command(report: socket.socket, uid: int, gid: int, last_cap: int, argv: Sequence[str]) -> None:
    """PID 2: tell the starter our host PID (the kernel fills in the credentials), drop
    privileges, become the pod's command."""
    report.send(b"pid")
    report.close()
    become(uid, gid, last_cap)
    os.execvp(argv[0], list(argv))


def _init(view: FsView, report: socket.socket, ids: tuple[int, int], argv: Sequence[str]) -> int:
    """PID 1: set up the pod's files, start the command, reap until it ends."""
    last_cap = last_capability()
    set_up(view)
    command = os.fork()
    if command == 0:
        _in_child(lambda: _command(report, *ids, last_cap, argv))
    report.close()
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # no KeyboardInterrupt in init
    drop_bounding_set(last_cap)
    clear_capabilities()
    no_new_privs()
    while True:  # orphans of the pod come to init: reap them too
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        if pid == command:
            return _exit_code(status)


def _in_child(body: Callable[[], object]) -> None:
    """Run ``body`` in a forked child that must never return into the caller's code."""
    code = 126
    try:
        body()
    except BaseException as exc:  # reported, then this child ends
        print(f"pod sandbox: {exc}", file=sys.stderr, flush=True)
        code = 127 if isinstance(exc, FileNotFoundError) else 126
    os._exit(code)


def _received_pid(sock: socket.socket, timeout: float) -> int | None:
    """The host PID in the credentials of one datagram (None: the sender ended first)."""
    if not select.select([sock], [], [], timeout)[0]:
        return None
    data, ancillary, _, _ = sock.recvmsg(16, socket.CMSG_SPACE(_UCRED.size))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and data:
            return int(_UCRED.unpack(payload[: _UCRED.size])[0])
    return None


def run(
    view: FsView, netns_path: Path, ids: tuple[int, int], argv: Sequence[str], report_fd: int
) -> None:
    """Start the pod (see the module docstring); writes ``"<init> <command>\\n"``, their
    host PIDs, to ``report_fd`` and returns, leaving both running."""
    fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(fd, CLONE_NEWNET)
    finally:
        os.close(fd)
    unshare(POD_NAMESPACES)
    mount(None, Path("/"), None, MS_REC | MS_PRIVATE, "")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    init = os.fork()
    if init == 0:
        ours.close()
        os.close(report_fd)  # the starter reads until it closes
        _in_child(lambda: os._exit(_init(view, theirs, ids, argv)))
    theirs.close()
    command = _received_pid(ours, 30.0)
    if command is None:
        os.waitpid(init, 0)
        raise SandboxError("the pod's init ended before its command started")
    os.write(report_fd, f"{init} {command}\n".encode())


# --- pod exec ----------------------------------------------------------------------------


def _status_fields(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {key: value.strip() for key, _, value in (ln.partition(":") for ln in text.splitlines())}


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[19])


def pod_init(pid: int, start: int) -> tuple[int, int, tuple[int, int]]:
    """A pidfd of the pod's init (the parent of the pod's command ``pid`` started at
    ``start``), its host PID, and the command's (uid, gid)."""
    try:
        fields = _status_fields(pid)
        init = int(fields["PPid"])
        init_fd = os.pidfd_open(init)
    except (OSError, KeyError, ValueError) as exc:
        raise SandboxError(f"the pod's process {pid} is not running") from exc
    try:
        same_ns = os.stat(f"/proc/{init}/ns/pid").st_ino == os.stat(f"/proc/{pid}/ns/pid").st_ino
        is_init = _status_fields(init)["NSpid"].split()[-1] == "1"
        # Checked last: the command still runs, so its parent is still the init read above.
        if _start_time(pid) != start or not (same_ns and is_init):
            raise SandboxError(f"the pod's process {pid} is not running in its sandbox")
    except (OSError, KeyError, ValueError) as exc:
        os.close(init_fd)
        raise SandboxError(f"the pod's process {pid} is not running") from exc
    except SandboxError:
        os.close(init_fd)
        raise
    uid, gid = int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])
    return init_fd, init, (uid, gid)


def _forward(child: int) -> None:
    for sig in FORWARDED:
        signal.signal(sig, lambda number, _frame: os.kill(child, number))


def exec_in(pid: int, start: int, argv: Sequence[str]) -> int:
    """Run ``argv`` in the running pod whose command is ``pid`` (see the module
    docstring); returns its exit code, or ends this process with its signal."""
    init_fd, _, (uid, gid) = pod_init(pid, start)
    last_cap = last_capability()  # read here: no file is read as root in the pod's view
    setns(init_fd, CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET)  # for the child
    alive_r, alive_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(alive_w)

        def body() -> None:
            setns(init_fd, CLONE_NEWNS)  # the pod's files, its root and cwd
            os.chdir("/")
            become(uid, gid, last_cap)
            parent_death_signal(signal.SIGKILL)  # after become: a uid change clears it
            if select.select([alive_r], [], [], 0)[0]:  # EOF: the parent already died
                os._exit(137)
            os.execvp(argv[0], list(argv))

        _in_child(body)
    os.close(alive_r)
    _forward(child)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.waitstatus_to_exitcode(status)
