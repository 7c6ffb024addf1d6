"""Run the real ``podnet`` and ``kubectl`` binaries against a test master."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

KUBECTL = "/usr/bin/kubectl"  # the kubectl fixture (tests/conftest.py) checks its version


def run_podnet(
    kubeconfig: Path, *args: str, timeout: float = 60.0, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``podnet ARGS`` with KUBECONFIG set; never raises on a non-zero exit."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.run(
        [sys.executable, "-m", "podnet", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        check=False,
    )


def run_kubectl(
    kubeconfig: Path, *args: str, timeout: float = 60.0, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The real kubectl with the master's kubeconfig and a private cache dir."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(kubeconfig.parent)}
    cache = kubeconfig.parent / "kubectl-cache"
    return subprocess.run(
        [KUBECTL, f"--cache-dir={cache}", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        check=False,
    )
