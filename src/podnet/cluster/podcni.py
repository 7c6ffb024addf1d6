"""The local runtime's CNI calls: the node's CNI executable run for ADD and DEL with the
environment and config a runtime passes, and what the pod takes from ADD's result (its
address and its DNS settings)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from podnet import netns
from podnet.cluster.nodes import node_paths
from podnet.cluster.state import PodRecord
from podnet.cni.dnsconfig import cluster_dns
from podnet.cni.result import DNS, parse_result
from podnet.cni.types import CniError

IFNAME = "eth0"
CNI_TIMEOUT = 90.0


class PodError(Exception):
    """A pod operation failed (the message says why)."""


def plugin_config(conflist_path: Path) -> str:
    """The ``podnet`` plugin's config from the node's conflist, as a runtime passes it."""
    conflist = json.loads(conflist_path.read_text())
    for plugin in conflist.get("plugins", []):
        if plugin.get("type") == "podnet":
            conf = {"cniVersion": conflist.get("cniVersion"), "name": conflist.get("name")}
            return json.dumps({**conf, **plugin})
    raise PodError(f"no podnet plugin in {conflist_path}")


def cni_env(pod: PodRecord, command: str, bin_dir: Path, netns_path: str) -> dict[str, str]:
    """The environment a runtime gives the CNI executable."""
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod.namespace};K8S_POD_NAME={pod.name}"
    return {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": pod.container_id,
        "CNI_NETNS": netns_path,
        "CNI_IFNAME": IFNAME,
        "CNI_PATH": f"{bin_dir}:/usr/lib/cni",
        "CNI_ARGS": f"{args};K8S_POD_INFRA_CONTAINER_ID={pod.container_id}",
    }


def cni_call(state_dir: Path, pod: PodRecord, command: str) -> dict[str, Any]:
    """Run the node's CNI executable for ``command``; return its JSON answer ({} if none)."""
    paths = node_paths(state_dir, pod.node)
    netns_path = str(netns.path(pod.netns)) if netns.exists(pod.netns) else ""
    result = subprocess.run(
        [str(paths.shim)],
        input=plugin_config(paths.conflist),
        env=cni_env(pod, command, paths.cni_bin_dir, netns_path),
        capture_output=True,
        text=True,
        timeout=CNI_TIMEOUT,
    )
    answer = json.loads(result.stdout) if result.stdout.strip() else {}
    if result.returncode != 0:
        msg = answer.get("msg", result.stdout.strip() or result.stderr.strip())
        raise PodError(f"CNI {command} for {pod.key} failed: {msg} {answer.get('details', '')}")
    return answer if isinstance(answer, dict) else {}


def result_ip(result: Mapping[str, Any]) -> str:
    """The first IP of a CNI ADD result, without its prefix length."""
    ips = result.get("ips") or []
    if not ips:
        raise PodError(f"CNI ADD result has no IP: {json.dumps(result)[:200]}")
    return str(ips[0]["address"]).split("/")[0]


def result_dns(result: Mapping[str, Any], namespace: str) -> DNS:
    """The pod's DNS settings from an ADD result, as a runtime that uses ``dns`` takes
    them; a result without nameservers (an older agent) gets the cluster's settings with
    the first IP's gateway as the server."""
    try:
        parsed = parse_result(result)
    except CniError as exc:
        raise PodError(f"CNI ADD result is malformed: {exc}") from exc
    if parsed.dns.nameservers:
        return parsed.dns
    gateway = next((ip.gateway for ip in parsed.ips if ip.gateway), None)
    if gateway is None:
        raise PodError("CNI ADD result has neither DNS settings nor a gateway")
    return cluster_dns(gateway, namespace)
