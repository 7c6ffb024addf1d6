"""Released addresses rest before they are handed out again.

An address that was a pod's may still be named by something that has not caught up: the
old Pod's ``podIP`` (until its status is cleared), a rule compiled from it, a peer's
conntrack entry. host-local's round-robin cursor makes quick reuse unlikely but not
impossible (a full range, a reset cursor, a requested IP). ``Cooldown`` makes it
explicit: each released address is kept from reuse for ``seconds`` after its release (30, or
``$PODNET_IPAM_COOLDOWN_SECONDS``).

The record lives outside the host-local directory (its layout stays the reference
plugin's): one small file of ``<address> <until> .`` lines, appended to on each release
(a few µs; rewriting a whole file and renaming it over the old one cost 0.7-3.5 ms on
ext4, which flushes a replaced file's data, on every CNI DEL), and rewritten only when
the lines of expired or superseded entries outnumber the live ones by ``COMPACT_SLACK``.
A restarted agent keeps resting what it released before: the last line of an address
wins, expired ones are dropped, and a torn or damaged line (a crash mid-write) is
skipped. Wall-clock times, for the same reason.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from ipaddress import IPv4Address
from pathlib import Path

from podnet.envsettings import seconds_from_env

log = logging.getLogger("podnet.ipam.cooldown")

DEFAULT_SECONDS = 30.0
SECONDS_ENV = "PODNET_IPAM_COOLDOWN_SECONDS"  # tests shorten it
COMPACT_SLACK = 1000  # dead lines the record may hold before it is rewritten
END = "."  # ends every line: a line cut short by a crash has none and is skipped


class Cooldown:
    """Addresses released less than ``seconds`` ago; persisted in ``path`` (None: memory)."""

    def __init__(
        self,
        path: Path | None,
        seconds: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.seconds = (
            seconds_from_env(SECONDS_ENV, DEFAULT_SECONDS) if seconds is None else seconds
        )
        self.clock = clock
        self._lines = 0  # lines in the record file (live, expired and superseded)
        self._until: dict[IPv4Address, float] = self._load()

    def released(self, ips: Iterable[IPv4Address]) -> None:
        """``ips`` were just released: they rest from now on."""
        ips = list(ips)
        if not ips or self.seconds <= 0:
            return
        until = self.clock() + self.seconds
        for ip in ips:
            self._until[ip] = until
        self._prune()
        self._append(ips, until)

    def resting(self) -> set[IPv4Address]:
        """The addresses that may not be handed out now."""
        self._prune()
        return set(self._until)

    def _prune(self) -> None:
        now = self.clock()
        for ip in [ip for ip, until in self._until.items() if until <= now]:
            del self._until[ip]

    def _load(self) -> dict[IPv4Address, float]:
        if self.path is None:
            return {}
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring the unreadable cool-down record %s: %s", self.path, exc)
            return {}
        found: dict[IPv4Address, float] = {}
        damaged = 0
        for line in text.splitlines():
            if not line:
                continue
            try:
                ip, until, end = line.split()
                if end != END:
                    raise ValueError(line)
                found[IPv4Address(ip)] = float(until)
            except ValueError:
                damaged += 1
        if damaged:
            log.warning("skipped %d damaged lines of the cool-down record %s", damaged, self.path)
        self._lines = len(found) + damaged
        now = self.clock()
        return {ip: until for ip, until in found.items() if until > now}

    def _append(self, ips: list[IPv4Address], until: float) -> None:
        if self.path is None:
            return
        if self._lines > COMPACT_SLACK + 2 * len(self._until):
            self._compact()
            return
        # a leading newline: a line torn by a crash stays a line of its own
        lines = "\n" + "".join(f"{ip} {until:.3f} {END}\n" for ip in ips)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        self._lines += len(ips)

    def _compact(self) -> None:
        """Rewrite the record with the live entries only (replaced by rename)."""
        assert self.path is not None
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        body = "".join(f"{ip} {until:.3f} {END}\n" for ip, until in self._until.items())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(body)
        with contextlib.suppress(FileNotFoundError):
            os.replace(tmp, self.path)
        self._lines = len(self._until)
