"""Named network namespaces: create, remove, enter (per thread), and run commands inside.

Namespaces are created by exact name under /run/netns (the same place ``ip netns`` uses)
and removed by exact name only. ``entered(name)`` switches the *calling thread* into a
namespace and back, which is how a netlink socket is opened inside a pod or node
namespace without spawning a helper process (a socket stays in the namespace it was
created in).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)


def path(name: str) -> Path:
    """Where a named namespace is bound."""
    return NETNS_DIR / name


def exists(name: str) -> bool:
    return path(name).exists()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns failed: {os.strerror(err)}")


def create(name: str) -> Path:
    """Create namespace ``name`` (idempotent) with its loopback up; return its path."""
    if not exists(name):
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
    subprocess.run(
        ["ip", "-n", name, "link", "set", "lo", "up"], check=True, capture_output=True, timeout=30
    )
    return path(name)


def remove(name: str) -> bool:
    """Remove namespace ``name`` if it exists (exact name only); True if it was there."""
    if not exists(name):
        return False
    result = subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    return result.returncode == 0


@contextlib.contextmanager
def entered(target: str | Path) -> Iterator[None]:
    """Run the body with the calling thread inside ``target`` (a name or a path)."""
    ns_path = Path(target) if str(target).startswith("/") else path(str(target))
    home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    try:
        target_fd = os.open(ns_path, os.O_RDONLY)
        try:
            _setns(target_fd)
        finally:
            os.close(target_fd)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


def command(name: str, argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped to run inside namespace ``name`` (through nsenter)."""
    return ["nsenter", f"--net={path(name)}", "--", *argv]


def run(
    name: str, argv: Sequence[str], timeout: float = 30.0, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside namespace ``name``, capturing its output."""
    return subprocess.run(
        command(name, argv), capture_output=True, text=True, timeout=timeout, check=check
    )
