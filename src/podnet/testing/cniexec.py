"""A node's installed CNI executable run as a container runtime runs it: inside the node
namespace, with the runtime's environment and the conflist's podnet entry on stdin."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podnet import netns
from podnet.cluster import nodes
from podnet.testing.e2e import load_state

IFNAME = "eth0"
CNI_TIMEOUT = 60.0


@dataclass(frozen=True)
class CniAnswer:
    """What the CNI executable said: exit code, and its JSON (``{}`` if none)."""

    returncode: int
    body: dict[str, Any]
    text: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def code(self) -> int:
        """The CNI error code (0 on success, -1 if the output was no error JSON)."""
        return 0 if self.ok else int(self.body.get("code", -1))


def run_cni(
    state_dir: Path, node: str, env: dict[str, str], extra: dict[str, Any] | None = None
) -> CniAnswer:
    """Run ``node``'s installed CNI executable inside the node namespace, as its runtime
    would: the podnet plugin's conflist entry (plus ``extra``) on stdin."""
    paths = nodes.node_paths(state_dir, node)
    conflist = json.loads(paths.conflist.read_text())
    plugin = next(p for p in conflist["plugins"] if p.get("type") == "podnet")
    config = {"cniVersion": conflist["cniVersion"], "name": conflist["name"], **plugin}
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "CNI_PATH": f"{paths.cni_bin_dir}:/usr/lib/cni",
        "CNI_IFNAME": IFNAME,
        **env,
    }
    argv = netns.command(load_state(state_dir).nodes[node].netns, [str(paths.shim)])
    try:
        done = subprocess.run(
            argv,
            input=json.dumps({**config, **(extra or {})}),
            env=full_env,
            capture_output=True,
            text=True,
            timeout=CNI_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return CniAnswer(-9, {"msg": f"no answer in {CNI_TIMEOUT}s"}, "")
    try:
        body = json.loads(done.stdout) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        body = {}
    return CniAnswer(done.returncode, body if isinstance(body, dict) else {}, done.stdout)
