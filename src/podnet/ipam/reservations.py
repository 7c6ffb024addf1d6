"""Reservation files of a host-local directory, as the reference plugin writes them.

One file per address holds its owner, ``<containerID>\\r\\n<ifname>`` (older plugins
wrote the ID only: ``parse_owner`` gives ifname "" for those); a file whose text names no
owner is damaged (a write torn by a crash). The directory's ``lock`` file is flock'ed
around every operation, by every store and by the reference binary. The store built on
these files is ``podnet.ipam.hostlocal``.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterable
from contextlib import suppress
from ipaddress import IPv4Address
from pathlib import Path

from podnet.ipam.config import IpamError

LINE_BREAK = "\r\n"
FILE_MODE = 0o600
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


class IpamArgumentError(IpamError, ValueError):
    """Container ID or interface name unusable in a reservation file."""


class IpamLockTimeout(IpamError):
    """The store's lock stayed busy past the timeout (transient: retry later)."""


def checked_id(container_id: str, ifname: str, *, legacy: bool = False) -> str:
    """The trimmed container ID; ``legacy`` allows ifname "" (ID-only reservations)."""
    cid = container_id.strip()
    if not cid or any(c.isspace() for c in cid):
        raise IpamArgumentError(f"invalid container ID {container_id!r}")
    if (not ifname and not legacy) or any(c.isspace() for c in ifname):
        raise IpamArgumentError(f"invalid interface name {ifname!r}")
    return cid


def owner_line(container_id: str, ifname: str) -> str:
    """The reservation file content for (container ID, ifname), as the reference writes it."""
    return f"{checked_id(container_id, ifname)}{LINE_BREAK}{ifname}"


def parse_owner(text: str) -> tuple[str, str]:
    """(container ID, ifname) from a reservation file; ifname is "" in legacy files."""
    cid, _, ifname = text.strip().partition(LINE_BREAK)
    return cid, ifname


def well_formed(text: str) -> bool:
    """Whether a reservation file's text names an owner (an empty or garbled file does
    not: a write torn by a crash of an older podnet or of another plugin)."""
    try:
        checked_id(*parse_owner(text), legacy=True)
    except IpamArgumentError:
        return False
    return True


def read_at(dfd: int, name: str) -> str | None:
    """Stripped content of a small file in the directory, or None if it cannot be read."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def ipv4s(names: Iterable[str]) -> list[IPv4Address]:
    """The names that are IPv4 addresses, as sorted addresses."""
    out = []
    for name in names:
        with suppress(ValueError):
            out.append(IPv4Address(name))
    return sorted(out)


def flock(fd: int, deadline: float, path: Path) -> None:
    """LOCK_EX with a deadline: poll LOCK_NB with a short exponential back-off."""
    delay = 0.0002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise IpamLockTimeout(f"timed out waiting for the flock on {path}")
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.01)
