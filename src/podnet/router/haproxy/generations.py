"""Generations of rendered files on disk, and the switch from one to the next.

Each table is written whole into a fresh ``gen-<n>`` directory (files unchanged since the
live generation are hard links to it), flushed to disk with one ``syncfs``, checked with
``haproxy -c``, and only then made live by replacing the ``current`` link in one rename.
A generation that fails the check is kept as ``rejected`` with HAProxy's output beside it,
and the live one goes on serving. Old generations are removed once a newer one is live.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path
from types import MappingProxyType

from podnet.files import write_atomic
from podnet.router.haproxy.render import Generation
from podnet.router.haproxy.settings import CONFIG, CURRENT, HAProxySettings

_GEN = re.compile(r"^gen-(\d+)$")
REJECTED = "rejected"
CHECK_TIMEOUT = 120.0
_libc = ctypes.CDLL(None, use_errno=True)


class ConfigRejected(Exception):
    """``haproxy -c`` refused a generation; the message is HAProxy's own output."""


def _syncfs(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs {directory}: {os.strerror(err)}")
    finally:
        os.close(fd)


class GenerationStore:
    """The generation directories in ``run_dir`` and the ``current`` link."""

    def __init__(self, settings: HAProxySettings) -> None:
        self.settings = settings
        self.run_dir = settings.run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        numbers = [int(m.group(1)) for p in self.run_dir.iterdir() if (m := _GEN.match(p.name))]
        self._next = max(numbers, default=0) + 1
        self._naming = threading.Lock()
        self._scratch: set[str] = set()  # generations being checked only: never pruned
        self._live: Generation | None = None  # what ``current`` holds, once written by us

    def live_dir(self) -> Path | None:
        """The live generation's directory, if any."""
        link = self.settings.current
        return link.resolve() if link.is_symlink() else None

    def write(self, generation: Generation, scratch: bool = False) -> Path:
        """Write ``generation`` into a new directory, durably; return the directory.
        A ``scratch`` one is only checked: ``discard`` removes it, ``activate`` keeps it."""
        with self._naming:  # the driver's applier and a check may write at once
            target = self.run_dir / f"gen-{self._next}"
            self._next += 1
            if scratch:
                self._scratch.add(target.name)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(mode=0o700)
        live, old = self.live_dir(), self._live
        for relative, text in generation.files.items():
            path = target / relative
            path.parent.mkdir(exist_ok=True, mode=0o700)
            if live is not None and old is not None and old.files.get(relative) == text:
                with contextlib.suppress(OSError):
                    os.link(live / relative, path)
                    continue
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, generation.mode(relative))
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
        _syncfs(target)
        return target

    def check(self, directory: Path) -> None:
        """Run ``haproxy -c`` on the generation; raise ``ConfigRejected`` with its output."""
        argv = [self.settings.haproxy, "-c", "-f", str(directory / CONFIG)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CHECK_TIMEOUT)
        if done.returncode != 0:
            raise ConfigRejected((done.stdout + done.stderr).strip() or f"exit {done.returncode}")

    def reject(self, directory: Path, reason: str) -> None:
        """Keep a refused generation as ``rejected`` (replacing the last one) for reading."""
        rejected = self.run_dir / REJECTED
        shutil.rmtree(rejected, ignore_errors=True)
        directory.rename(rejected)
        write_atomic(rejected / "check.txt", reason + "\n")

    def activate(self, directory: Path, generation: Generation) -> None:
        """Make ``directory`` the live generation (one rename) and drop older ones."""
        link = self.settings.current
        tmp = self.run_dir / f".{CURRENT}.tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(directory.name)
        os.replace(tmp, link)
        dir_fd = os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._live = generation
        self._prune(keep=directory.name)

    def replace_config(self, text: str) -> None:
        """Rewrite only the live generation's ``haproxy.cfg`` (atomically): after runtime
        server changes, which change no other file."""
        live, generation = self.live_dir(), self._live
        if live is None or generation is None:
            raise RuntimeError("no live generation to rewrite")
        write_atomic(live / CONFIG, text, generation.mode(CONFIG))
        self._live = Generation(MappingProxyType({**generation.files, CONFIG: text}))

    def discard(self, directory: Path) -> None:
        """Remove a scratch generation."""
        shutil.rmtree(directory, ignore_errors=True)
        with self._naming:
            self._scratch.discard(directory.name)

    def _prune(self, keep: str) -> None:
        with self._naming:
            spare = {keep, *self._scratch}
        for path in self.run_dir.iterdir():
            if _GEN.match(path.name) and path.name not in spare:
                shutil.rmtree(path, ignore_errors=True)
