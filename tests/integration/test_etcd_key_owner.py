"""The real-host guide's etcd key step and the etcd unit agree (issue 20): the unit runs
etcd as ``User=etcd`` (as Debian's etcd-server runs it), so after the guide's commands
the user can read every certificate and key the unit names, and no one else can read a
key. Before, the guide left the keys root's (0600) and etcd could not start.

The guide's shell lines that touch ``/etc/podnet/etcd-pki`` run here as written, with
that directory moved under a scratch root; the unit's user then opens each file.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from podnet.testing.units import exec_start, load_unit

pytestmark = [pytest.mark.root]  # chown, and opening files as another user

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "examples" / "systemd"
PKI = "/etc/podnet/etcd-pki"
FENCED = re.compile(r"^[ \t]*```(?:sh|bash|console)?[ \t]*\n(.*?)^[ \t]*```", re.M | re.S)


def guide() -> str:
    """The real-host guide: docs/real-hosts.md, else the README's section."""
    docs = ROOT / "docs" / "real-hosts.md"
    if docs.exists():
        return docs.read_text()
    text = (ROOT / "README.md").read_text()
    start = text.index("## Running podnet on real hosts")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def key_step(text: str) -> list[str]:
    """The guide's shell lines on the etcd PKI directory, continuations joined."""
    lines = []
    for block in FENCED.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if line and not line.startswith("#") and PKI in line:
                lines.append(line)
    return lines


def as_here(line: str, root: Path) -> str:
    """A guide line for the scratch root: its paths under it, ``python`` this one."""
    line = line.replace(PKI, f"{root}{PKI}")
    return re.sub(r"^python3? ", f"{sys.executable} ", line)


@pytest.fixture
def host_root() -> Iterator[Path]:
    """A scratch root the unit's user can walk into (pytest's tmp_path is root's 0700)."""
    made = Path(tempfile.mkdtemp(prefix="podnet-etcd-keys-"))
    made.chmod(0o755)
    (made / "etc/podnet").mkdir(parents=True)
    (made / "etc/podnet").chmod(0o755)
    (made / "etc").chmod(0o755)
    try:
        yield made
    finally:
        shutil.rmtree(made)


def unreadable(unit_path: Path, text: str, root: Path) -> list[str]:
    """Run the guide's key step under ``root``; what the unit's user cannot read, and
    keys others can read."""
    unit = load_unit(unit_path)
    user = unit.value("Service", "User") if unit.values("Service", "User") else "root"
    try:
        pwd.getpwnam(user)
    except KeyError:
        pytest.fail(f"no user {user} here (Debian's etcd-server package creates it)")
    step = key_step(text)
    assert step, f"the guide has no shell step on {PKI}"
    for line in step:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", as_here(line, root)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert done.returncode == 0, f"{line}:\n{done.stderr}"
    problems = []
    for word in exec_start(unit):
        if not word.startswith(PKI + "/"):
            continue
        path = root / word.lstrip("/")
        read = subprocess.run(
            ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "cat", str(path)],
            capture_output=True,
            timeout=30,
        )
        if read.returncode != 0:
            mode = stat.filemode(path.stat().st_mode) if path.exists() else "missing"
            owner = pwd.getpwuid(path.stat().st_uid).pw_name if path.exists() else "-"
            problems.append(f"{user} cannot read {word} ({owner} {mode})")
        elif path.suffix == ".key" and path.stat().st_mode & 0o077:
            problems.append(f"{word} is readable by others: {oct(path.stat().st_mode)}")
    return problems


def test_the_etcd_user_reads_what_the_guide_installs(host_root: Path) -> None:
    unit = UNITS / "podnet-etcd.service"
    assert load_unit(unit).value("Service", "User") == "etcd"  # Debian's etcd-server's user
    assert unreadable(unit, guide(), host_root) == []
    assert os.stat(host_root / PKI.lstrip("/")).st_mode & 0o077 == 0  # the directory 0700


def test_a_root_only_key_step_fails_the_check(host_root: Path) -> None:
    """The guide as it was (keys left 0600 root) is caught."""
    make = f"python -m podnet.store.etcd_pki --dir {PKI} \\\n  --member etcd1=10.0.0.11"
    old = f"```sh\n{make}\n```\n"
    problems = unreadable(UNITS / "podnet-etcd.service", old, host_root)
    assert any("etcd cannot read" in p and "member-etcd1.key" in p for p in problems), problems
