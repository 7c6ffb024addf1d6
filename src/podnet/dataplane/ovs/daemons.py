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
``stop``/``stop_instance`` end both by PID and leave no process, socket or pidfile.

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
import select
import shutil
import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from podnet.dataplane.interface import DataPlaneError, NodeSetupRefused

log = logging.getLogger(__name__)

OVSDB_SERVER: Final = "ovsdb-server"
VSWITCHD: Final = "ovs-vswitchd"
DAEMONS: Final = (OVSDB_SERVER, VSWITCHD)  # start order; stopped in reverse
SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
KERNEL_MODULE = Path("/sys/module/openvswitch")
SUN_PATH_MAX: Final = 107  # sun_path is 108 bytes, the last one the NUL
BRIDGE_NAME_MAX: Final = 15  # a bridge is a network device: IFNAMSIZ - 1
STOP_TIMEOUT: Final = 5.0  # SIGTERM, then SIGKILL after this many seconds
RUN_TIMEOUT: Final = 30.0  # a daemon's start (it detaches once ready), ovsdb-tool, ovs-vsctl
PACKAGES: Final = {
    OVSDB_SERVER: "openvswitch-switch",
    VSWITCHD: "openvswitch-switch",
    "ovs-vsctl": "openvswitch-switch",
    "ovsdb-tool": "openvswitch-common",
    "ovs-ofctl": "openvswitch-common",
    "nsenter": "util-linux",
}

Restarted = Callable[[str], Awaitable[None]]


class OvsUnavailable(NodeSetupRefused):
    """Open vSwitch cannot run here as asked (a missing binary, a path too long...)."""


class OvsDaemonError(DataPlaneError):
    """A daemon failed to start or to stop (the message has its output)."""


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


@dataclass(frozen=True)
class OvsPaths:
    """Where one instance keeps its database, sockets, pidfiles and logs."""

    base: Path

    @property
    def db(self) -> Path:
        return self.base / "db" / "conf.db"

    @property
    def run_dir(self) -> Path:
        return self.base / "run"

    @property
    def log_dir(self) -> Path:
        return self.base / "log"

    @property
    def db_socket(self) -> Path:
        return self.run_dir / "db.sock"

    def pidfile(self, daemon: str) -> Path:
        return self.run_dir / f"{daemon}.pid"

    def unixctl(self, daemon: str) -> Path:
        """The daemon's control socket (``ovs-appctl -t``, ``ofproto/trace``)."""
        return self.run_dir / f"{daemon}.ctl"

    def log(self, daemon: str) -> Path:
        return self.log_dir / f"{daemon}.log"

    def mgmt(self, bridge: str) -> Path:
        """The bridge's OpenFlow socket, which ``ovs-ofctl`` finds through ``OVS_RUNDIR``."""
        return self.run_dir / f"{bridge}.mgmt"

    def env(self) -> dict[str, str]:
        """The environment that points OVS's tools at this instance."""
        return {
            **os.environ,
            "OVS_RUNDIR": str(self.run_dir),
            "OVS_LOGDIR": str(self.log_dir),
            "OVS_DBDIR": str(self.db.parent),
        }

    def check(self) -> None:
        """OvsUnavailable unless every socket path fits ``sun_path`` (108 bytes)."""
        longest = self.run_dir / f"{'b' * BRIDGE_NAME_MAX}.snoop"
        for sock in (self.db_socket, self.unixctl(VSWITCHD), self.unixctl(OVSDB_SERVER), longest):
            if len(os.fsencode(sock.absolute())) > SUN_PATH_MAX:
                raise OvsUnavailable(
                    f"OVS socket path {sock.absolute()} is longer than {SUN_PATH_MAX} bytes"
                    f" (a unix socket's limit): choose a shorter base directory than {self.base}"
                )


def _proc_exe(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).removesuffix(" (deleted)")
    except OSError:
        return ""


def _proc_args(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def running_pid(paths: OvsPaths, daemon: str) -> int | None:
    """The PID of this instance's ``daemon`` if it runs: the pidfile's PID, alive, running
    that daemon's binary with this pidfile on its command line; else None."""
    try:
        pid = int(paths.pidfile(daemon).read_text().strip())
    except (OSError, ValueError):
        return None
    if pid <= 0 or _proc_exe(pid) != daemon:
        return None
    return pid if f"--pidfile={paths.pidfile(daemon)}" in _proc_args(pid) else None


def _wait_exit(pidfd: int, timeout: float) -> bool:
    """Whether the process behind ``pidfd`` exited within ``timeout`` seconds."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def _stop_daemon(paths: OvsPaths, daemon: str, timeout: float) -> bool:
    """SIGTERM this instance's ``daemon``, SIGKILL it after ``timeout``; True if it ran.
    Signals go through a pidfd, so they reach that very process or none."""
    pid = running_pid(paths, daemon)
    if pid is None:
        return False
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        if not _wait_exit(pidfd, timeout):
            log.warning("%s (pid %d) ignored SIGTERM for %.1fs: SIGKILL", daemon, pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            if not _wait_exit(pidfd, timeout):
                raise OvsDaemonError(f"{daemon} (pid {pid}) survived SIGKILL for {timeout}s")
    finally:
        os.close(pidfd)
    return True


def _leftovers(paths: OvsPaths) -> Iterator[Path]:
    """The sockets and pidfiles a daemon killed by SIGKILL leaves in the run directory."""
    yield paths.db_socket
    for daemon in DAEMONS:
        yield paths.pidfile(daemon)
        yield paths.unixctl(daemon)
    if paths.run_dir.is_dir():
        yield from paths.run_dir.glob("*.mgmt")
        yield from paths.run_dir.glob("*.snoop")


def stop_instance(base: Path, remove: bool = False, timeout: float = STOP_TIMEOUT) -> list[str]:
    """Stop the instance under ``base`` by PID (vswitchd, then ovsdb-server) and remove its
    sockets and pidfiles; with ``remove`` also its database and logs (all of ``base``).
    Needs no namespace: this is how ``cluster down`` ends a node's OVS. Returns the names
    of the daemons that were running."""
    paths = OvsPaths(base)
    stopped = [d for d in reversed(DAEMONS) if _stop_daemon(paths, d, timeout)]
    for leftover in _leftovers(paths):
        leftover.unlink(missing_ok=True)
    if remove:
        shutil.rmtree(base, ignore_errors=True)
    return stopped


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
        """Run until cancelled or stopped: when a daemon dies, start it again and then await
        ``restarted(name)`` (after ``ovs-vswitchd``, the bridges are back without flows).
        A failed restart is retried every ``retry`` seconds, doubling up to 5 s."""
        delay = retry
        while not self._stopping:
            dead = await self._first_death()
            if self._stopping:
                return
            log.warning("%s under %s died: restarting it", dead, self.paths.base)
            try:
                await asyncio.to_thread(self._ensure, dead)
            except DataPlaneError as error:
                log.error("restarting %s failed, again in %.1fs: %s", dead, delay, error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = retry
            await restarted(dead)

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
