"""What podnet installs on a host: its systemd units (``systemd/``, shipped in the wheel;
``examples/systemd`` links there) and their environment files, and how they are started.

``install_unit`` writes a unit as shipped (0644); ``write_env`` writes an environment
file (0644: addresses and names only, never a secret); ``start`` enables and starts the
units through systemctl when systemd runs this host, and otherwise says what to run.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

from podnet.files import write_atomic

UNITS_DIR = Path("/etc/systemd/system")
CONFIG_DIR = Path("/etc/podnet")
SYSTEMD_RUNNING = Path("/run/systemd/system")  # what sd_booted() checks


def unit_text(name: str) -> str:
    """The shipped unit (or environment example) ``name``."""
    return resources.files("podnet.deploy").joinpath("systemd", name).read_text()


def install_unit(name: str, units_dir: Path = UNITS_DIR) -> Path:
    """Write the shipped unit ``name`` into ``units_dir`` (0644); return its path."""
    units_dir.mkdir(parents=True, exist_ok=True)
    path = units_dir / name
    write_atomic(path, unit_text(name), 0o644)
    return path


def write_env(path: Path, values: Mapping[str, str]) -> Path:
    """An EnvironmentFile (0644) of ``values``: names and addresses, no secret."""
    for key, value in values.items():
        if not key.isidentifier() or "\n" in value or "\\" in value or '"' in value:
            raise ValueError(f"{path.name}: {key}={value!r} cannot be written as is")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    text = "".join(f"{key}={value}\n" for key, value in values.items())
    write_atomic(path, text, 0o644)
    return path


def parse_env(text: str) -> dict[str, str]:
    """An EnvironmentFile's variables (``KEY=VALUE`` lines; ``#`` lines are comments)."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def systemd_running() -> bool:
    return SYSTEMD_RUNNING.is_dir()


def start(units: Sequence[str]) -> str:
    """Enable and start ``units`` with systemctl when systemd runs this host; else (a
    container, a test host) leave them and say so. Returns what was done."""
    if not systemd_running():
        return "systemd does not run this host: start " + " ".join(units) + " yourself"
    subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=60)
    subprocess.run(["systemctl", "enable", "--now", *units], check=True, timeout=120)
    return "enabled and started " + shlex.join(units)
