"""What a pod's processes see of the file system, set up by the pod's init as root in the
pod's fresh, private mount namespace (nothing propagates back to the host):

1. each file of the ``etc`` directory (``/etc/netns/<pod netns>``: the pod's
   ``resolv.conf``) is bound over the file of that name in ``/etc``, as ``ip netns
   exec`` does, and each volume's host directory over its target (the router's files);
2. an empty read-only tmpfs covers each hidden directory (the cluster's state dir with
   the master's tokens, keys and kubeconfigs, the nodes' credentials and CNI sockets,
   etcd's data; podnet's default directories);
3. each exposed directory (the Python interpreter and podnet) that lies below a
   directory others cannot enter (``/root`` for a pyenv Python) is made reachable: that
   directory is covered by a tmpfs holding only bind mounts of the exposed ones;
4. every directory any user may write to (``PRIVATE_TMPFS``: ``/tmp``, ``/var/tmp``,
   ``/dev/shm``, ``/run/lock``) gets the pod's own size-limited tmpfs, so no file one
   pod writes is seen by another, or outlives the pod;
5. a new ``/proc`` of the pod's PID namespace, which lists only the pod's processes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from podnet.cluster.sandboxsys import (
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    mount,
)

# The host's shared writable places (sticky, world-writable): each pod gets its own.
PRIVATE_TMPFS = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path("/run/lock"))
TMPFS_SIZE = "64m"  # per directory, as Docker's /dev/shm; counted in the host's memory
TMPFS_INODES = "16k"


@dataclass(frozen=True)
class FsView:
    """The mounts of a pod's view (see the module docstring)."""

    hide: tuple[Path, ...] = ()
    expose: tuple[Path, ...] = ()
    etc: Path | None = None
    volumes: tuple[tuple[Path, Path], ...] = ()  # (host directory, where the pod sees it)


def closed_ancestor(path: Path) -> Path | None:
    """The topmost directory above ``path`` that others may not enter (no ``o+x``)."""
    for ancestor in reversed(path.parents[:-1]):  # from the top, without "/"
        if not ancestor.stat().st_mode & stat.S_IXOTH:
            return ancestor
    return None


def outermost(paths: Iterable[Path]) -> list[Path]:
    """``paths`` without those inside another of them, sorted."""
    found = sorted(set(paths))
    return [p for p in found if not any(p != q and p.is_relative_to(q) for q in found)]


def _mount_empty(path: Path) -> None:
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    mount("tmpfs", path, "tmpfs", flags, "size=4k,mode=0555")


def _expose(paths: Iterable[Path]) -> None:
    """Cover each closed directory above ``paths`` with a tmpfs that holds only bind
    mounts of the exposed directories inside it (taken by fd before the cover)."""
    covers: dict[Path, list[Path]] = {}
    for path in outermost(paths):
        if (closed := closed_ancestor(path)) is not None:
            covers.setdefault(closed, []).append(path)
    for closed, inside in covers.items():
        handles = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in inside}
        mount("tmpfs", closed, "tmpfs", MS_NOSUID | MS_NODEV, "size=4k,mode=0711")
        for path, fd in handles.items():
            os.makedirs(path, mode=0o711, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, "")
            os.close(fd)
        flags = MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
        mount(None, closed, None, flags, "size=4k,mode=0711")


def _bind_etc(directory: Path) -> None:
    """Bind each regular file of ``directory`` over the existing file of that name in
    /etc (dot files, and names /etc lacks, are skipped)."""
    for name in sorted(os.listdir(directory)):
        source, target = directory / name, Path("/etc") / name
        if not name.startswith(".") and source.is_file() and target.exists():
            mount(str(source), target, None, MS_BIND, "")


def private_tmpfs(paths: Iterable[Path] = PRIVATE_TMPFS, keep: Iterable[Path] = ()) -> None:
    """A fresh, size-limited, sticky world-writable tmpfs on each existing directory. The
    directories of ``keep`` below one (the Python and podnet the pod runs with, when they
    are installed under /tmp) are bound back in at their place, taken by fd before the
    cover, as ``_expose`` does: without them the pod's command could not start."""
    data = f"size={TMPFS_SIZE},nr_inodes={TMPFS_INODES},mode=1777"
    kept = outermost(keep)
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            inside = [k for k in kept if k != path and k.is_relative_to(path) and k.is_dir()]
            handles = {k: os.open(k, os.O_PATH | os.O_CLOEXEC) for k in inside}
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, data)
            for k, fd in handles.items():
                os.makedirs(k, mode=0o711, exist_ok=True)
                mount(f"/proc/self/fd/{fd}", k, None, MS_BIND | MS_REC, "")
                os.close(fd)


def set_up(view: FsView) -> None:
    """Steps 1 to 5 of the module docstring, in the pod's mount and PID namespaces."""
    if view.etc is not None:
        _bind_etc(view.etc)
    for source, target in view.volumes:  # before hiding: a source may lie in a hidden dir
        mount(str(source), target, None, MS_BIND | MS_REC, "")
    for path in view.hide:
        _mount_empty(path)
    _expose(view.expose)  # after hiding: a hidden directory inside stays hidden (MS_REC)
    private_tmpfs(keep=view.expose)  # after hiding: a state dir below /tmp is out of sight
    mount("proc", Path("/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "")
    os.chdir("/")  # a working directory inside a hidden one would still be open
