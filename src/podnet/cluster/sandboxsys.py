"""The Linux calls the pod sandbox needs that Python 3.11's ``os`` lacks: ``mount``,
``unshare``, ``setns``, ``prctl`` and ``capset``, through libc. Each failure raises
``SandboxError`` naming the step. Only stdlib imports: this runs once per pod process."""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

# <linux/sched.h>
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x8000000, 0x20000000, 0x40000000
# <linux/mount.h>
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
# <linux/prctl.h>
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


class SandboxError(Exception):
    """The sandbox could not be set up (the message says which step failed)."""


def _check(result: int, step: str) -> None:
    if result != 0:
        raise SandboxError(f"{step}: {os.strerror(ctypes.get_errno())}")


def _bytes(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


def mount(source: str | None, target: Path, fstype: str | None, flags: int, data: str) -> None:
    """mount(2); ``data`` empty for none."""
    result = _libc.mount(_bytes(source), bytes(target), _bytes(fstype), flags, _bytes(data or None))
    _check(result, f"mounting {source or fstype} on {target}")


def unshare(flags: int) -> None:
    """unshare(2): new namespaces for this process (a PID namespace: for its children)."""
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def setns(fd: int, flags: int) -> None:
    """setns(2) by a namespace file or a pidfd (several namespaces at once)."""
    _check(_libc.setns(fd, flags), f"setns({flags:#x})")


def no_new_privs() -> None:
    """No setuid or file-capability binary can give privileges back after this."""
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def parent_death_signal(signal: int) -> None:
    """``signal`` to this process when its parent thread dies."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal, 0, 0, 0), "parent death signal")


def last_capability() -> int:
    return int(Path("/proc/sys/kernel/cap_last_cap").read_text())


def drop_bounding_set(last_cap: int, keep: frozenset[int] = frozenset()) -> None:
    """Drop capabilities 0..``last_cap`` but ``keep`` from the bounding set and clear the
    ambient set: no later exec can gain them (needs CAP_SETPCAP, so before dropping root)."""
    for cap in range(last_cap + 1):
        if cap in keep:
            continue
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient")


def clear_capabilities() -> None:
    """Empty effective, permitted and inheritable sets (whatever the uid)."""
    header = ctypes.create_string_buffer(struct.pack("=Ii", _CAPABILITY_VERSION_3, 0))
    data = ctypes.create_string_buffer(bytes(24))  # two {effective, permitted, inheritable}
    _check(_libc.capset(header, data), "clearing capabilities")


def capability_sets(pid: int | str = "self") -> dict[str, int]:
    """The Cap* lines of ``/proc/<pid>/status`` (Inh, Prm, Eff, Bnd, Amb) as integers."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.startswith("Cap"):
            found[key[3:]] = int(value.strip(), 16)
    return found
