"""A pod namespace's own ``resolv.conf``: ``/etc/netns/<netns name>/resolv.conf``, the place
``ip netns exec`` bind-mounts over ``/etc/resolv.conf`` (and the pod sandbox does too).

Created and removed by exact name with the pod. Removal takes only the file this module
writes, then the directory if that leaves it empty; ``/etc/netns`` itself stays (other
tools share it).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

ETC_NETNS = Path("/etc/netns")
RESOLV_CONF = "resolv.conf"


class PodResolvError(ValueError):
    """A namespace name that cannot name a directory under /etc/netns."""


def netns_etc_dir(netns_name: str, root: Path = ETC_NETNS) -> Path:
    """``/etc/netns/<netns_name>``; PodResolvError unless the name is one plain path part."""
    if not netns_name or netns_name in (".", "..") or "/" in netns_name or "\0" in netns_name:
        raise PodResolvError(f"{netns_name!r} is not a namespace name")
    return root / netns_name


def write_resolv_conf(netns_name: str, text: str, root: Path = ETC_NETNS) -> Path:
    """Write the namespace's resolv.conf atomically (mode 0644); return its path."""
    directory = netns_etc_dir(netns_name, root)
    root.mkdir(mode=0o755, exist_ok=True)
    directory.mkdir(mode=0o755, exist_ok=True)
    path = directory / RESOLV_CONF
    tmp = directory / f".{RESOLV_CONF}.tmp"
    tmp.write_text(text)
    tmp.chmod(0o644)
    tmp.replace(path)
    return path


def remove_resolv_conf(netns_name: str, root: Path = ETC_NETNS) -> bool:
    """Remove the namespace's resolv.conf (and its directory if then empty); True if a
    file was removed. Other files in the directory, and the directory then, stay."""
    directory = netns_etc_dir(netns_name, root)
    removed = False
    for name in (RESOLV_CONF, f".{RESOLV_CONF}.tmp"):
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
            removed = removed or name == RESOLV_CONF
    try:
        os.rmdir(directory)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
            raise
    return removed
