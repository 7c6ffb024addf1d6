"""One node's own Open vSwitch: a private ``ovsdb-server`` and ``ovs-vswitchd``.

Both run under a base directory the caller chooses (the agent passes
``<state dir>/ovs``): ``db/conf.db``, ``run/`` (pidfiles, the database socket, the unixctl
sockets and each bridge's ``.mgmt`` socket, mode 0700) and ``log/``. They start in the
network namespace of the thread that *constructed* ``OvsDaemons`` (the node's namespace),
detached with pidfiles, so they outlive the agent: the datapath keeps forwarding while a
killed agent restarts, and the restarted agent adopts the running daemons (the PID from
the pidfile must be alive, be that daemon's binary and carry this instance's pidfile on
its command line, so a recycled PID is never taken for it).

``supervise`` waits on a pidfd per daemon, restarts one that died and then tells the
caller, which reprograms the flows (a restarted ``ovs-vswitchd`` starts with none).
``stop``/``stop_instance`` end both by PID and leave no process, socket or pidfile. The
layout on disk, which PID is really the daemon, and the stop by PID are in ``instance``.

The bridge uses the kernel datapath where the ``openvswitch`` module is loaded or can be
loaded, else the userspace one (``netdev``). ``--disable-system-route`` is deliberately
not passed: ``ovs-vswitchd`` runs in the node's namespace, so the routes it reads (for
VXLAN's native tunnelling) are the node's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from podnet.dataplane.interface import DataPlaneError
from podnet.dataplane.ovs.instance import (
    DAEMONS,
    OVSDB_SERVER,
    VSWITCHD,
    OvsDaemonError,
    OvsPaths,
    OvsUnavailable,
    running_pid,
    stop_instance,
)

log = logging.getLogger(__name__)

SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
KERNEL_MODULE = Path("/sys/module/openvswitch")
DB_PROBE_TIMEOUT: Final = 2.0  # ovsdb-server's answer to an echo before vswitchd starts
RUN_TIMEOUT: Final = 30.0  # a daemon's start (it detaches once ready), ovsdb-tool, ovs-vsctl
PACKAGES: Final = {
    OVSDB_SERVER: "openvswitch-switch",
    VSWITCHD: "openvswitch-switch",
    "ovs-vsctl": "openvswitch-switch",
    "ovsdb-tool": "openvswitch-common",
    "ovs-ofctl": "openvswitch-common",
    "nsenter": "util-linux",
}

__all__ = [  # also the instance's names, so one import serves the callers
    "DAEMONS",
    "OVSDB_SERVER",
    "VSWITCHD",
    "OvsDaemonError",
    "OvsDaemons",
    "OvsPaths",
    "OvsUnavailable",
    "binary",
    "datapath_type",
    "running_pid",
    "stop_instance",
]

Restarted = Callable[[str], Awaitable[None]]


def binary(name: str) -> str:
    """The path of OVS tool ``name``; OvsUnavailable names the package when it is missing."""
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if found is None:
        raise OvsUnavailable(f"{name} not found: install the Debian package {PACKAGES[name]}")
    return found


def datapath_type(module: Path = KERNEL_MODULE) -> str:
    """``system`` (the kernel datapath) when the ``openvswitch`` module is loaded or loads
    now, else ``netdev`` (the userspace datapath)."""
    if module.exists():
        return "system"
    modprobe = shutil.which("modprobe", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if modprobe is not None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([modprobe, "-q", "openvswitch"], capture_output=True, timeout=10)
    return "system" if module.exists() else "netdev"


class OvsDaemons:
    """The node's ``ovsdb-server`` and ``ovs-vswitchd`` under ``base``, in the network
    namespace of the constructing thread.

        with podnet.netns.entered(node_ns):   # or: already running inside the node
            daemons = OvsDaemons(state_dir / "ovs")
        await daemons.start()                  # adopts running daemons
        task = asyncio.create_task(daemons.supervise(reprogram))
        ...
        await daemons.stop(remove=True)
    """

    def __init__(self, base: Path, datapath: str | None = None) -> None:
        self.paths = OvsPaths(base.absolute())
        self.paths.check()
        self.datapath = datapath if datapath is not None else datapath_type()
        if self.datapath not in ("system", "netdev"):
            raise OvsUnavailable(f"unknown OVS datapath type {self.datapath!r}")
        self._tools = {name: binary(name) for name in PACKAGES if name != "ovs-ofctl"}
        if not SCHEMA.exists():
            raise OvsUnavailable(
                f"{SCHEMA} not found: install the Debian package openvswitch-switch"
            )
        self._netns = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self._stopping = False

    def pid(self, daemon: str) -> int | None:
        """The running daemon's PID, or None."""
        return running_pid(self.paths, daemon)

    async def start(self) -> list[str]:
        """Create the database if missing, then start each daemon unless it runs already
        (then it is adopted). Returns the names of the daemons it started."""
        self._stopping = False
        return await asyncio.to_thread(self._start)

    async def stop(self, remove: bool = False) -> list[str]:
        """Stop both daemons (see ``stop_instance``); the supervisor restarts nothing after
        this. Returns the names of the daemons that were running."""
        self._stopping = True
        return await asyncio.to_thread(stop_instance, self.paths.base, remove)

    def close(self) -> None:
        """Let go of the namespace handle (the daemons keep running)."""
        if self._netns >= 0:
            os.close(self._netns)
            self._netns = -1

    def _start(self) -> list[str]:
        for folder in (self.paths.db.parent, self.paths.run_dir, self.paths.log_dir):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.chmod(0o700)  # root's alone: the sockets program the node's network
        if not self.paths.db.exists():
            self._run(["ovsdb-tool", "create", str(self.paths.db), str(SCHEMA)])
        started = []
        if self._ensure(OVSDB_SERVER):
            started.append(OVSDB_SERVER)
        db = f"--db=unix:{self.paths.db_socket}"
        self._run(["ovs-vsctl", db, "--no-wait", f"--timeout={int(RUN_TIMEOUT)}", "init"])
        if self._ensure(VSWITCHD):
            started.append(VSWITCHD)
        return started

    def _ensure(self, daemon: str) -> bool:
        """Start ``daemon`` unless it runs; True if it was started."""
        pid = self.pid(daemon)
        if pid is not None:
            log.info("adopted %s (pid %d) under %s", daemon, pid, self.paths.base)
            return False
        if daemon == VSWITCHD and not self._db_answers():  # it would wait for it, detached
            raise OvsDaemonError(f"{OVSDB_SERVER} does not answer: {VSWITCHD} not started")
        for stale in (self.paths.pidfile(daemon), self.paths.unixctl(daemon)):
            stale.unlink(missing_ok=True)  # left by a SIGKILL; the daemon would refuse to start
        self._spawn(daemon)
        pid = self.pid(daemon)
        if pid is None:
            raise OvsDaemonError(
                f"{daemon} exited right after it started; see {self.paths.log(daemon)}"
            )
        log.info("started %s (pid %d) under %s", daemon, pid, self.paths.base)
        return True

    def _db_answers(self) -> bool:
        """Whether ``ovsdb-server`` answers an echo request. A killed one accepts
        connections for a moment while it exits, so connecting is not enough."""
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(DB_PROBE_TIMEOUT)
            try:
                probe.connect(str(self.paths.db_socket))
                probe.sendall(b'{"method":"echo","params":[],"id":"probe"}')
                return b'"probe"' in probe.recv(4096)
            except OSError:
                return False

    def _argv(self, daemon: str) -> list[str]:
        paths = self.paths
        common = [
            f"--pidfile={paths.pidfile(daemon)}",
            f"--unixctl={paths.unixctl(daemon)}",
            f"--log-file={paths.log(daemon)}",
            "-vconsole:err",
            "--detach",
            "--no-chdir",
        ]
        if daemon == OVSDB_SERVER:
            return [str(paths.db), f"--remote=punix:{paths.db_socket}", *common]
        userspace = ["--disable-system"] if self.datapath == "netdev" else []
        return [f"unix:{paths.db_socket}", *common, *userspace]

    def _spawn(self, daemon: str) -> None:
        """Run ``daemon`` in this instance's namespace; it returns once it has detached."""
        if self._netns < 0:
            raise OvsDaemonError("OvsDaemons is closed")
        netns = f"--net=/proc/{os.getpid()}/fd/{self._netns}"
        self._run(["nsenter", netns, "--", self._tools[daemon], *self._argv(daemon)])

    def _run(self, argv: list[str]) -> None:
        command = [self._tools.get(argv[0], argv[0]), *argv[1:]]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=self.paths.env()
            )
        except subprocess.TimeoutExpired as error:
            raise OvsDaemonError(f"{' '.join(argv[:2])} timed out after {RUN_TIMEOUT}s") from error
        if done.returncode != 0:
            raise OvsDaemonError(
                f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}"
            )

    async def supervise(self, restarted: Restarted, retry: float = 0.2) -> None:
        """Run until cancelled or stopped: when a daemon dies, start what is not running
        (``ovsdb-server`` first: ``ovs-vswitchd`` needs its database), then await
        ``restarted(name)`` for each daemon started (after ``ovs-vswitchd`` the bridges are
        back, without flows). A failed start is retried after ``retry`` seconds, doubling
        up to 5 s; an error raised by ``restarted`` is logged and supervision goes on."""
        delay = retry
        while not self._stopping:
            dead = await self._first_death()
            if self._stopping:
                return
            log.warning("%s under %s died: restarting it", dead, self.paths.base)
            try:
                started = await asyncio.to_thread(self._ensure_all)
            except DataPlaneError as error:
                log.error("restarting %s failed, again in %.1fs: %s", dead, delay, error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = retry
            for daemon in started:
                try:
                    await restarted(daemon)
                except Exception:  # the caller's own failure must not end supervision
                    log.exception("reacting to the restart of %s failed", daemon)

    def _ensure_all(self) -> list[str]:
        return [d for d in DAEMONS if not self._stopping and self._ensure(d)]

    async def _first_death(self) -> str:
        """Wait until one of the daemons is not running; return its name."""
        loop = asyncio.get_running_loop()
        died: asyncio.Future[str] = loop.create_future()
        pidfds: list[int] = []
        try:
            for daemon in DAEMONS:
                pid = self.pid(daemon)
                if pid is None:
                    return daemon
                try:
                    pidfd = os.pidfd_open(pid)
                except ProcessLookupError:
                    return daemon
                pidfds.append(pidfd)
                if self.pid(daemon) != pid:  # it died (or was replaced) before the pidfd
                    return daemon
                loop.add_reader(pidfd, _settle, died, daemon)
            return await died
        finally:
            for pidfd in pidfds:
                loop.remove_reader(pidfd)
                os.close(pidfd)


def _settle(future: asyncio.Future[str], value: str) -> None:
    if not future.done():
        future.set_result(value)
