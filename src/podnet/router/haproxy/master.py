"""The HAProxy master process: started, reloaded and stopped by the router, by PID only.

HAProxy runs in master-worker mode (``-W``) with its master CLI on a unix socket (``-S``)
and its pid file in the run directory. A reload is the master's ``reload`` command: it
re-executes itself, reads the ``current`` generation, takes the listening sockets over from
the old worker and starts a new worker, while the old worker finishes its connections
(``hard-stop-after`` bounds that). A master left running by an earlier router (same run
directory, same config path) is adopted rather than started twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from podnet.router.haproxy.runtimeapi import (
    MasterCLI,
    ProcessList,
    RuntimeAPIError,
    connection_refused,
)
from podnet.router.haproxy.settings import HAProxySettings
from podnet.store.etcd_process import pid_alive

START_TIMEOUT = 30.0
RELOAD_TIMEOUT = 60.0
POLL = 0.02


class ReloadFailed(Exception):
    """The master could not start a worker with the new generation (the old one serves)."""


def _alive(pid: int) -> bool:
    """Running: there, and not a zombie (one that exited and waits to be reaped)."""
    if not pid_alive(pid):
        return False
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


class HAProxyMaster:
    """One HAProxy master for ``settings``: start or adopt, reload, stop."""

    def __init__(self, settings: HAProxySettings) -> None:
        self.settings = settings
        self.cli = MasterCLI(settings.master_socket)
        self.pid: int | None = None
        self.worker: int | None = None  # the current worker, which runtime commands go to
        self._process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        s = self.settings
        return [
            s.haproxy,
            *("-W", "-S", f"{s.master_socket},mode,600"),
            *("-f", str(s.config), "-p", str(s.pid_file)),
        ]

    def _running_master(self) -> int | None:
        """The pid of a master from an earlier router for this run dir, if it still runs."""
        try:
            pid = int(self.settings.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        argv = self.argv()  # after a reload the master's own argv also has -sf <pids>
        return pid if _alive(pid) and _cmdline(pid)[1 : len(argv)] == argv[1:] else None

    async def start(self) -> bool:
        """Start the master, or adopt a running one; True if adopted (it still serves
        its old generation: reload it). Returns once a worker runs."""
        adopted = self._running_master()
        if adopted is not None:
            self.pid = adopted
        else:
            log = open(self.settings.run_dir / "haproxy.log", "ab")  # noqa: SIM115
            with log:
                self._process = subprocess.Popen(
                    self.argv(),
                    cwd=self.settings.run_dir,
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                )
            self.pid = self._process.pid
        procs = await self._wait(lambda p: bool(p.workers), START_TIMEOUT, "start")
        self.worker = procs.workers[0]
        return adopted is not None

    async def processes(self) -> ProcessList:
        """``show proc``, retried while the master re-executes (it refuses connections)."""
        deadline = time.monotonic() + RELOAD_TIMEOUT
        while True:
            try:
                return await self.cli.processes()
            except (TimeoutError, OSError, RuntimeAPIError) as error:
                if not self.running():
                    raise ReloadFailed(f"haproxy master exited: {self._log_tail()}") from error
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(POLL)

    async def _wait(
        self, done: Callable[[ProcessList], bool], timeout: float, what: str
    ) -> ProcessList:
        deadline = time.monotonic() + timeout
        while True:
            procs = await self.processes()
            if done(procs):
                return procs
            if time.monotonic() > deadline:
                raise ReloadFailed(f"haproxy {what}: no new worker after {timeout} s")
            await asyncio.sleep(POLL)

    async def reload(self) -> None:
        """Reload and wait for the new worker; ``ReloadFailed`` if the master kept the old."""
        before = await self.processes()
        for attempt in range(50):
            try:
                await self.cli.request_reload()
                break
            except OSError as error:
                if not connection_refused(error) or attempt == 49:
                    raise
                await asyncio.sleep(POLL)

        def finished(p: ProcessList) -> bool:
            return p.failed_reloads > before.failed_reloads or (
                p.reloads > before.reloads and bool(set(p.workers) - set(before.workers))
            )

        procs = await self._wait(finished, RELOAD_TIMEOUT, "reload")
        if procs.failed_reloads > before.failed_reloads:
            raise ReloadFailed(f"haproxy refused the reload: {self._log_tail()}")
        self.worker = next(w for w in procs.workers if w not in before.workers)

    def running(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None
        return self.pid is not None and _alive(self.pid)

    def _log_tail(self) -> str:
        try:
            return (self.settings.run_dir / "haproxy.log").read_text()[-2000:].strip()
        except OSError:
            return "(no log)"

    async def stop(self, grace: float | None = None) -> None:
        """Soft-stop (SIGUSR1: finish connections), then SIGTERM, then SIGKILL, by PID."""
        pid = self.pid
        if pid is None:
            return
        grace = self.settings.hard_stop_after + 5 if grace is None else grace
        for sig, wait in ((signal.SIGUSR1, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if not self.running():
                break
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while self.running() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        if self._process is not None:
            self._process.wait(timeout=10)
        self.pid = self.worker = None
        self._process = None
