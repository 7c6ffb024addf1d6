"""What the agent installs for container runtimes: the podnet CNI plugin (the shim) in the
CNI bin directory, and the conflist that names it, each rewritten only when it changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from podnet.agent.config import AgentConfig
from podnet.cni.build import C_SOURCE, PLUGIN_NAME, PY_SOURCES, SOURCE_DIR, install_shim
from podnet.files import write_if_changed


def conflist(config: AgentConfig, mtu: int) -> str:
    """The CNI config list runtimes read: podnet, then portmap for hostPorts."""
    plugin = {"type": "podnet", "socketPath": str(config.socket_path), "mtu": mtu}
    portmap = {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True}
    doc = {"cniVersion": "1.0.0", "name": config.network_name, "plugins": [plugin, portmap]}
    return json.dumps(doc, indent=2) + "\n"


def _digest(*paths: Path, extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode())
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def install_plugin_once(bin_dir: Path, python: str, stamp_file: Path) -> tuple[Path, bool]:
    """Install the CNI plugin unless the one in ``bin_dir`` was built from the same
    sources (a restart then skips the ~2 s compile). Returns (path, installed)."""
    sources = [C_SOURCE, *(SOURCE_DIR / name for name in PY_SOURCES)]
    stamp = _digest(*sources, extra=os.path.realpath(python))
    plugin = bin_dir / PLUGIN_NAME
    with contextlib.suppress(OSError):
        if stamp_file.read_text().split() == [stamp, _digest(plugin)]:
            return plugin, False
    plugin = install_shim(bin_dir, python)
    write_if_changed(stamp_file, f"{stamp} {_digest(plugin)}\n", 0o600)
    return plugin, True
