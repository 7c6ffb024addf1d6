"""HAProxy's CLI over its unix sockets: one command per connection, with a timeout.

The master socket takes ``reload`` and ``show proc``, and routes a command to a worker
when it is prefixed with ``@!<pid>``; the driver sends its runtime changes that way, to
the worker it knows is current, so none lands in an old worker that is shutting down.
The master refuses connections while it re-executes itself during a reload: callers
retry (``connection_refused``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass
from pathlib import Path

COMMAND_TIMEOUT = 10.0


class RuntimeAPIError(Exception):
    """A CLI command failed or got an answer other than the one that means success."""


def connection_refused(error: BaseException) -> bool:
    """True for the errors of a socket that is not there or not accepting yet."""
    return isinstance(error, ConnectionRefusedError | FileNotFoundError | ConnectionResetError)


async def send(path: Path, command: str, timeout: float = COMMAND_TIMEOUT) -> str:
    """Send one command (no newline in it) and return the whole answer."""
    if "\n" in command or ";" in command:
        raise RuntimeAPIError(f"one command at a time, without newline or ';': {command!r}")

    async def exchange() -> str:
        reader, writer = await asyncio.open_unix_connection(str(path))
        try:
            writer.write(command.encode() + b"\n")
            await writer.drain()
            sock = writer.get_extra_info("socket")
            if sock is not None:  # the master CLI answers only once the input has ended
                sock.shutdown(socket.SHUT_WR)
            return (await reader.read()).decode(errors="replace")
        finally:
            writer.close()

    return await asyncio.wait_for(exchange(), timeout)


@dataclass(frozen=True)
class ProcessList:
    """``show proc`` on the master: its reloads and failures, the current workers."""

    master_pid: int
    reloads: int
    failed_reloads: int
    workers: tuple[int, ...]  # current workers (not those still draining)
    old_workers: tuple[int, ...]


def parse_show_proc(text: str) -> ProcessList:
    """Parse ``show proc`` (HAProxy 2.6's layout)."""
    section, master = "", (0, 0, 0)
    workers: list[int] = []
    old: list[int] = []
    for line in text.splitlines():
        if line.startswith("# "):
            section = line[2:].strip()
            continue
        fields = line.split()
        if len(fields) < 3 or not fields[0].isdigit():
            continue
        if fields[1] == "master":
            failed = line.split("[failed:", 1)[1].split("]", 1)[0] if "[failed:" in line else "0"
            master = (int(fields[0]), int(fields[2]), int(failed))
        elif fields[1] == "worker":
            (workers if section == "workers" else old).append(int(fields[0]))
    if not master[0]:
        raise RuntimeAPIError(f"no master in show proc: {text[:200]!r}")
    return ProcessList(master[0], master[1], master[2], tuple(workers), tuple(old))


class MasterCLI:
    """The master socket: processes, reloads, and commands routed to a worker."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def processes(self) -> ProcessList:
        return parse_show_proc(await send(self.path, "show proc"))

    async def request_reload(self) -> None:
        """Ask for a reload; the master closes the connection as it re-executes."""
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            await send(self.path, "reload")

    async def to_worker(self, pid: int, command: str) -> str:
        """``command`` answered by worker ``pid``."""
        answer = await send(self.path, f"@!{pid} {command}")
        if answer.startswith("Can't find the target PID"):
            raise RuntimeAPIError(f"worker {pid} is gone: {answer.strip()}")
        return answer

    async def expect_worker(self, pid: int, command: str, *success: str) -> None:
        """``command`` sent to worker ``pid``; an answer but one of ``success`` fails."""
        answer = (await self.to_worker(pid, command)).strip()
        if answer not in success:
            raise RuntimeAPIError(f"{command!r}: {answer or 'no answer'}")
