"""One node's Open vSwitch instance on disk and in the process table.

Where an instance keeps its database, sockets, pidfiles and logs (``OvsPaths``), which
PID is really this instance's daemon (the pidfile's PID must be alive, run that daemon's
binary and carry this instance's pidfile on its command line, so a recycled PID or
another node's daemon is never taken for it), and ``stop_instance``: both daemons ended
by PID through a pidfd and their sockets and pidfiles removed. Needs no namespace and
no running agent, so ``cluster down`` uses it as well.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from podnet.dataplane.interface import DataPlaneError, NodeSetupRefused

log = logging.getLogger(__name__)

OVSDB_SERVER: Final = "ovsdb-server"
VSWITCHD: Final = "ovs-vswitchd"
DAEMONS: Final = (OVSDB_SERVER, VSWITCHD)  # start order; stopped in reverse
SUN_PATH_MAX: Final = 107  # sun_path is 108 bytes, the last one the NUL
BRIDGE_NAME_MAX: Final = 15  # a bridge is a network device: IFNAMSIZ - 1
STOP_TIMEOUT: Final = 5.0  # SIGTERM, then SIGKILL after this many seconds


class OvsUnavailable(NodeSetupRefused):
    """Open vSwitch cannot run here as asked (a missing binary, a path too long...)."""


class OvsDaemonError(DataPlaneError):
    """A daemon failed to start or to stop (the message has its output)."""


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
