"""wrk runs and what they report: requests/s, p99 and every error class.

wrk keeps each of its ``-c`` connections alive and counts, per class: ``connect``
(the connection could not be made), ``read`` (the server closed or reset a kept-alive
connection, or sent what its HTTP parser refuses), ``write``, ``timeout`` (no answer
within ``--timeout``) and non-2xx/3xx answers. A class it prints no line for is 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}
_REQUESTS = re.compile(r"^\s*(\d+) requests in ", re.M)
_RATE = re.compile(r"Requests/sec:\s+([\d.]+)")
_P99 = re.compile(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_STATUS = re.compile(r"Non-2xx or 3xx responses: (\d+)")


class WrkOutputError(ValueError):
    """wrk's output lacks a figure every run prints (requests, rate or p99)."""


@dataclass(frozen=True)
class WrkRun:
    """One wrk run: its answers, rate, p99 (ms) and errors by class."""

    requests: int
    rate: float
    p99_ms: float
    connect: int = 0
    read: int = 0
    write: int = 0
    timeout: int = 0
    non_2xx: int = 0

    @property
    def errors(self) -> dict[str, int]:
        """Each error class with its count (zeros included)."""
        return {
            "connect": self.connect,
            "read": self.read,
            "write": self.write,
            "timeout": self.timeout,
            "non-2xx/3xx": self.non_2xx,
        }


def command(url: str, seconds: int, connections: int, threads: int = 1) -> list[str]:
    """The wrk command line (keep-alive connections, latency distribution)."""
    return ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", url]


def parse(text: str) -> WrkRun:
    """The figures of one run's output (``--latency``), or ``WrkOutputError``."""
    requests, rate, p99 = _REQUESTS.search(text), _RATE.search(text), _P99.search(text)
    if requests is None or rate is None or p99 is None:
        raise WrkOutputError(f"unexpected wrk output:\n{text}")
    socket = _SOCKET.search(text)
    connect, read, write, timeout = (int(n) for n in socket.groups()) if socket else (0,) * 4
    status = _STATUS.search(text)
    return WrkRun(
        requests=int(requests.group(1)),
        rate=float(rate.group(1)),
        p99_ms=float(p99.group(1)) * _UNITS[p99.group(2)],
        connect=connect,
        read=read,
        write=write,
        timeout=timeout,
        non_2xx=int(status.group(1)) if status else 0,
    )
