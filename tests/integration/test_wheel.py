"""The wheel the real-host guide installs (``pip wheel .``) carries what a host needs
beyond the Python modules: the C shim's source (a node builds the CNI shim from it, else
falls back to the slower Python shim), the systemd units and their environment examples,
py.typed, and the ``podnet`` command."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow]


def test_the_wheel_carries_the_shim_source_the_units_and_the_command(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: a build writes build/ and *.egg-info beside it
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    argv = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path)]
    subprocess.run([*argv, str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("podnet-*-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    units = sorted(p.name for p in (ROOT / "src/podnet/deploy/systemd").iterdir())
    assert units and all(f"podnet/deploy/systemd/{u}" in names for u in units), units
    assert "podnet/cni/podnet-cni.c" in names
    assert "podnet/py.typed" in names
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry).decode()
    assert "podnet = podnet.cli.main:main" in text
