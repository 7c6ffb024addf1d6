"""podnet.files: atomic writes that survive a crash, and writes skipped when nothing changed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from podnet import files


def synced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    return calls


def test_write_if_changed_syncs_file_and_directory_and_creates_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = synced(monkeypatch)
    path = tmp_path / "a" / "b" / "stamp"
    assert files.write_if_changed(path, "one\n", 0o600)
    assert path.read_text() == "one\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(calls) == 2  # the file's data, then the directory holding the rename
    assert [p.name for p in path.parent.iterdir()] == ["stamp"]


def test_write_if_changed_leaves_an_identical_file_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "conf"
    assert files.write_if_changed(path, "same\n")
    inode = path.stat().st_ino
    calls = synced(monkeypatch)
    assert not files.write_if_changed(path, "same\n")
    assert calls == [] and path.stat().st_ino == inode
    assert files.write_if_changed(path, "other\n")
    assert path.read_text() == "other\n" and path.stat().st_ino != inode
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
