"""A pod's hostPorts: the ``portmap`` plugin of the node's CNI chain, run as a runtime runs
it, inside the node's namespace.

The agent's conflist chains ``podnet`` then ``portmap`` (capability ``portMappings``).
The local runtime (``podcni``) runs the first; for a pod with hostPorts (the router's
80 and 443) this module runs the second, with the runtime's ``runtimeConfig`` (the
Pod's ``hostPort``/``containerPort`` pairs) and podnet's ADD result as ``prevResult``,
in the node namespace, where a kubelet and its runtime would run it: so its DNAT rules
(``table ip nat``, iptables-nft) live in the node namespace, never in the root one. They
send TCP to any of the node's own addresses on a hostPort to the pod's port. ADD is
idempotent (the plugin rewrites its per-container chain); the rules go with the node
namespace, or with DEL.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podnet import netns
from podnet.cluster.nodes import node_paths
from podnet.cluster.podcni import PodError, cni_env
from podnet.cluster.state import PodRecord

PLUGIN = "portmap"
SEARCH = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
TIMEOUT = 30.0


@dataclass(frozen=True)
class HostPort:
    """One ``containerPort`` published on the node's addresses at ``host``."""

    host: int
    container: int
    protocol: str = "tcp"

    def container_port(self, name: str) -> dict[str, Any]:
        """The Pod spec's ``ports`` entry."""
        return {
            "name": name,
            "containerPort": self.container,
            "hostPort": self.host,
            "protocol": self.protocol.upper(),
        }


def portmap_config(
    conflist: Mapping[str, Any], ports: Sequence[HostPort], prev_result: Mapping[str, Any]
) -> dict[str, Any]:
    """The config the runtime gives ``portmap``: its conflist entry without
    ``capabilities``, with ``runtimeConfig.portMappings`` and ``prevResult``."""
    entries = [p for p in conflist.get("plugins", []) if p.get("type") == PLUGIN]
    if not entries:
        raise PodError(f"the node's conflist chains no {PLUGIN} plugin")
    entry = {k: v for k, v in entries[0].items() if k != "capabilities"}
    return {
        "cniVersion": conflist.get("cniVersion"),
        "name": conflist.get("name"),
        **entry,
        "runtimeConfig": {"portMappings": [_mapping(port) for port in ports]},
        "prevResult": dict(prev_result),
    }


def _mapping(port: HostPort) -> dict[str, Any]:
    """The ``portMappings`` entry a runtime passes (CNI conventions)."""
    return {"hostPort": port.host, "containerPort": port.container, "protocol": port.protocol}


def plugin_path(bin_dirs: Sequence[Path]) -> Path:
    """The ``portmap`` executable in the first directory that has it."""
    for directory in bin_dirs:
        if (directory / PLUGIN).is_file():
            return directory / PLUGIN
    raise PodError(f"no {PLUGIN} CNI plugin in {', '.join(map(str, bin_dirs))}")


def call_portmap(
    state_dir: Path,
    node_netns: str,
    pod: PodRecord,
    command: str,
    ports: Sequence[HostPort],
    prev_result: Mapping[str, Any],
) -> None:
    """Run ``portmap`` for ``command`` (ADD or DEL) inside ``node_netns``; PodError if it fails."""
    paths = node_paths(state_dir, pod.node)
    config = portmap_config(json.loads(paths.conflist.read_text()), ports, prev_result)
    executable = plugin_path((paths.cni_bin_dir, *SEARCH))
    pod_netns = str(netns.path(pod.netns)) if netns.exists(pod.netns) else ""
    env = cni_env(pod, command, executable.parent, pod_netns)
    result = subprocess.run(
        netns.command(node_netns, [str(executable)]),
        input=json.dumps(config),
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    if result.returncode != 0:
        detail = result.stdout.strip() or result.stderr.strip()
        raise PodError(f"{PLUGIN} {command} for {pod.key} on {pod.node} failed: {detail}")
