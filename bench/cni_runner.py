"""Timing CNI plugins the way a runtime calls them: one process per ADD/DEL."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podnet import netns


@dataclass
class Plugin:
    """A plugin binary and the network config it gets on stdin."""

    label: str
    binary: Path
    config: dict[str, Any]
    cni_path: str

    def call(self, command: str, container_id: str, pod_ns: str | None) -> float:
        """Run one CNI command; return its wall time in ms (raises on failure)."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container_id,
            "CNI_NETNS": str(netns.path(pod_ns)) if pod_ns else "",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": self.cni_path,
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={container_id}",
        }
        stdin = json.dumps(self.config)
        started = time.perf_counter()
        result = subprocess.run(
            [str(self.binary)], input=stdin, env=env, capture_output=True, text=True, timeout=60
        )
        elapsed = (time.perf_counter() - started) * 1000
        if result.returncode != 0:
            raise RuntimeError(f"{self.label} {command} failed: {result.stdout} {result.stderr}")
        return elapsed


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclass
class Latencies:
    add: list[float]
    delete: list[float]

    def summary(self) -> dict[str, float]:
        return {
            "ADD p50": statistics.median(self.add),
            "ADD p99": percentile(self.add, 99),
            "DEL p50": statistics.median(self.delete),
            "DEL p99": percentile(self.delete, 99),
        }


def make_pod_namespaces(prefix: str, count: int) -> list[str]:
    names = [f"{prefix}-{i}" for i in range(count)]
    for name in names:
        netns.create(name)
    return names


def remove_namespaces(names: Sequence[str]) -> None:
    for name in names:
        netns.remove(name)


def sequential(plugin: Plugin, node_ns: str, pods: Sequence[str]) -> Latencies:
    """ADD every pod one after another, then DEL them; runs inside ``node_ns``."""
    with netns.entered(node_ns):
        adds = [plugin.call("ADD", f"seq-{pod}", pod) for pod in pods]
        dels = [plugin.call("DEL", f"seq-{pod}", pod) for pod in pods]
    return Latencies(adds, dels)


def concurrent_adds(plugin: Plugin, node_ns: str, pods: Sequence[str]) -> float:
    """Wall time (s) of ADDs for every pod at once; the pods are DELeted afterwards."""

    def add(pod: str) -> float:
        with netns.entered(node_ns):
            return plugin.call("ADD", f"par-{pod}", pod)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(pods)) as pool:
        list(pool.map(add, pods))
    wall = time.perf_counter() - started

    def delete(pod: str) -> float:
        with netns.entered(node_ns):
            return plugin.call("DEL", f"par-{pod}", pod)

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(delete, pods))
    return wall


def reference_plugin(data_dir: Path, subnet: str = "10.200.0.0/16") -> Plugin:
    """The reference bridge + host-local plugins, as the baseline."""
    config = {
        "cniVersion": "1.0.0",
        "name": "refbench",
        "type": "bridge",
        "bridge": "cni-bench0",
        "isGateway": True,
        "ipMasq": False,
        "mtu": 1450,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": str(data_dir)},
    }
    return Plugin(
        "reference bridge+host-local", Path("/usr/lib/cni/bridge"), config, "/usr/lib/cni"
    )
