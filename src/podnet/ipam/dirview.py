"""A store's view of its host-local directory (reservation name <-> owner), kept exact
by inotify so that an operation re-reads only the files that changed.

host-local's layout holds the owner only inside each file, so an exact answer to "which
addresses does this container hold" used to mean reading every file (the reference's DEL
does). inotify tells which names changed, by anyone, through any process: the kernel
queues the event inside the changing system call, so once a store holds the directory's
flock, every change made before the flock was released is in its queue. Whenever the
kernel cannot say (queue overflow, the directory replaced, no inotify instance left), the
view is rebuilt by reading every file, as before.
"""

from __future__ import annotations

import ctypes
import os
import struct
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from podnet.ipam.atomic import TEMP_PREFIX

LOCK_NAME = "lock"
CURSOR_PREFIX = "last_reserved_ip."

IN_MODIFY, IN_CLOSE_WRITE = 0x2, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_UNMOUNT = 0x400, 0x800, 0x2000
IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR = 0x4000, 0x8000, 0x01000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
NAME_EVENTS = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
LOST = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_Q_OVERFLOW | IN_IGNORED
_EVENT = struct.Struct("=iIII")  # wd, mask, cookie, name length
_libc = ctypes.CDLL(None, use_errno=True)

Reader = Callable[[int, str], "str | None"]


def is_reservation(name: str) -> bool:
    """Whether ``name`` in the directory is an address file (not the lock, a cursor or a
    temporary file of ``podnet.ipam.atomic``; inotify names an O_TMPFILE inode "#<ino>")."""
    return name != LOCK_NAME and not name.startswith((CURSOR_PREFIX, TEMP_PREFIX, "#"))


class DirWatch:
    """inotify on one directory: the names changed since the last ``changes`` call."""

    def __init__(self, path: Path) -> None:
        """Watch ``path`` (OSError if inotify is unavailable or out of instances)."""
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        if _libc.inotify_add_watch(fd, os.fsencode(path), NAME_EVENTS | LOST | IN_ONLYDIR) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch {path} failed")
        self._fd = fd
        self.lost = False  # the kernel no longer tells about this directory
        self._close = weakref.finalize(self, os.close, fd)

    def changes(self) -> set[str] | None:
        """Names created, changed or removed since the last call; None if unknown."""
        names: set[str] = set()
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            for mask, name in _events(data):
                self.lost = self.lost or bool(mask & LOST)
                if name:
                    names.add(name)
        return None if self.lost else names

    def close(self) -> None:
        """Stop watching."""
        self._close()


def _events(data: bytes) -> Iterator[tuple[int, str]]:
    offset = 0
    while offset + _EVENT.size <= len(data):
        _, mask, _, length = _EVENT.unpack_from(data, offset)
        start = offset + _EVENT.size
        name = data[start : start + length].rstrip(b"\0")
        yield mask, os.fsdecode(name)
        offset = start + length


class DirIndex:
    """A store's view of its directory: reservation file name <-> owner text."""

    def __init__(self) -> None:
        self.owner_of: dict[str, str] = {}
        self._names_of: dict[str, set[str]] = {}

    def put(self, name: str, text: str) -> None:
        """Record that ``name`` holds ``text``."""
        self.drop(name)
        self.owner_of[name] = text
        self._names_of.setdefault(text, set()).add(name)

    def drop(self, name: str) -> None:
        """Forget ``name``."""
        text = self.owner_of.pop(name, None)
        if text is not None:
            names = self._names_of[text]
            names.discard(name)
            if not names:
                del self._names_of[text]

    def rebuild(self, dfd: int, read: Reader) -> None:
        """Forget everything; list the directory and read every reservation file."""
        self.owner_of, self._names_of = {}, {}
        for name in os.listdir(dfd):
            if is_reservation(name) and (text := read(dfd, name)) is not None:
                self.put(name, text)

    def update(self, dfd: int, read: Reader, names: Iterable[str]) -> None:
        """Re-read ``names`` (the changed ones, whatever the change): gone or unreadable
        ones are forgotten. A name still in the view may have been rewritten in place, or
        freed and reused for another owner, so every one is read again."""
        for name in sorted(names):
            if not is_reservation(name):
                continue
            text = read(dfd, name)
            if text is None:
                self.drop(name)
            else:
                self.put(name, text)

    def match(self, cid: str, ifname: str) -> list[str]:
        """Files of (trimmed container ID, ifname); legacy (ID-only) files only if none
        match exactly."""
        exact = self._names_of.get(f"{cid}\r\n{ifname}") if ifname else None
        return sorted(exact or self._names_of.get(cid) or ())
