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


# What every authenticated identity may read, as kube's system:discovery and
# system:public-info-viewer grant it, in `kubectl auth can-i --list`'s rows.
DISCOVERY_PATHS = (
    "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/readyz", "/leaderz",
    "/openapi", "/openapi/*", "/version", "/version/", "/cluster-info",
)  # fmt: skip
DISCOVERY_ROWS = frozenset(
    f"[{p}] [] [{verb}]" for p in DISCOVERY_PATHS for verb in ("get", "head")
)


def can_i_rows(listing: str) -> set[str]:
    """The rows of `kubectl auth can-i --list`, spaces collapsed and each row's verbs
    sorted (kubectl merges verbs in the order the rules give them)."""
    rows = set()
    for line in listing.splitlines()[1:]:
        *head, verbs = line.split("[")
        words = " ".join(sorted(verbs.rstrip(" ]").split()))
        rows.add(" ".join("[".join([*head, words + "]"]).split()))
    return rows
