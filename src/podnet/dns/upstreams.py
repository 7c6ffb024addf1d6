"""The node's upstream resolvers, read from a resolv.conf.

``nameservers`` parses the ``nameserver`` lines as glibc does (the first three, IPv4 or
IPv6, anything else ignored). ``Upstreams`` rereads the file when it changes (looked at
no more than once per ``recheck`` seconds) and leaves out the cluster DNS's own address,
so a node whose resolv.conf names the node's DNS server cannot make a forwarding loop.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("podnet.dns.upstreams")

MAX_NAMESERVERS = 3  # glibc's MAXNS
DNS_PORT = 53
Server = tuple[str, int]


def nameservers(text: str) -> list[str]:
    """The addresses of the first three valid ``nameserver`` lines of a resolv.conf."""
    found: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if len(words) < 2 or words[0] != "nameserver":
            continue
        try:
            found.append(str(ipaddress.ip_address(words[1].split("%", 1)[0])))
        except ValueError:
            continue
        if len(found) == MAX_NAMESERVERS:
            break
    return found


class Upstreams:
    """Where names outside the zone are sent: a resolv.conf's nameservers (port 53), or a
    fixed list (tests)."""

    def __init__(
        self,
        resolv_conf: Path | None = None,
        fixed: Iterable[Server] = (),
        exclude: Iterable[str] = (),
        recheck: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resolv_conf = resolv_conf
        self.fixed = list(fixed)
        self.exclude = set(exclude)
        self.recheck = recheck
        self.clock = clock
        self._servers: list[Server] = []
        self._stamp: tuple[int, int] | None = None
        self._checked: float | None = None
        self._failed = False  # the last read failed (logged once)

    def servers(self) -> list[Server]:
        """The servers to ask, in order (empty: nothing to forward to)."""
        if self.resolv_conf is None:
            return [s for s in self.fixed if s[0] not in self.exclude]
        now = self.clock()
        if self._checked is None or now - self._checked >= self.recheck:
            self._checked = now
            self._reload(self.resolv_conf)
        return self._servers

    def _reload(self, path: Path) -> None:
        try:
            status = os.stat(path)
            stamp = (status.st_mtime_ns, status.st_ino)
            if stamp == self._stamp:
                return
            text = path.read_text()
        except OSError as exc:
            if not self._failed:
                log.warning("cannot read upstream resolvers from %s: %s", path, exc)
            self._stamp, self._servers, self._failed = None, [], True
            return
        self._stamp, self._failed = stamp, False
        found = [ip for ip in nameservers(text) if ip not in self.exclude]
        self._servers = [(ip, DNS_PORT) for ip in found]
        log.info("upstream resolvers from %s: %s", path, ", ".join(found) or "none")
