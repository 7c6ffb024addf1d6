"""Run the real ``podnet`` and ``kubectl`` binaries against a test master."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

KUBECTL = "/usr/bin/kubectl"
KUBECTL_MIN_MINOR = 28  # Debian's own kubernetes-client (1.20) is too old for our API


def kubectl_problem(path: str = KUBECTL) -> str | None:
    """Why the kubectl at ``path`` cannot serve the tests (None when it can)."""
    if not Path(path).exists():
        return (
            f"{path} is missing: kubectl >= 1.{KUBECTL_MIN_MINOR} is part of this machine's image"
        )
    try:
        out = subprocess.run(
            [path, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30
        ).stdout
        minor = int("".join(c for c in json.loads(out)["clientVersion"]["minor"] if c.isdigit()))
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        return f"{path} does not report its version: {exc}"
    if minor < KUBECTL_MIN_MINOR:
        return f"{path} is 1.{minor}; podnet's tests need kubectl >= 1.{KUBECTL_MIN_MINOR}"
    return None


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
