"""Readiness of the local cluster's pods: a pod with a readiness check gets its prober
(``podnet.cluster.prober``, started in its node's namespace with the node's identity); a
pod without one is Ready once its process runs, as in Kubernetes, written once by the
runtime (the admin, which created the Pod). Every pod's process is registered with its
node's exit watcher (``podnet.cluster.podwatch``), which writes the pod not Ready,
Succeeded or Failed, with its exit code, when the process ends."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from podnet import netns
from podnet.cluster.nodes import NodePaths, node_paths
from podnet.cluster.podwatch import ready_file, register, unregister
from podnet.cluster.readiness import ReadinessCheck, readiness_status, rfc3339
from podnet.cluster.sandbox import exec_argv
from podnet.cluster.state import ClusterState, PodRecord, ProcessRecord, spawn

WATCHER_TIMEOUT = 30.0


def prober_log(state_dir: Path, pod: PodRecord) -> Path:
    return state_dir / "pods" / f"{pod.namespace}_{pod.name}.prober.log"


def prober_command(
    state: ClusterState, state_dir: Path, pod: PodRecord, check: ReadinessCheck
) -> list[str]:
    """The prober of ``pod``, wrapped to run in its node's namespace (a command check
    runs inside the running pod's sandbox, as its user)."""
    if pod.process is None:
        raise ValueError(f"pod {pod.key} has no process to probe")
    argv = [sys.executable, "-m", "podnet.cluster.prober"]
    argv += ["--kubeconfig", str(node_paths(state_dir, pod.node).kubeconfig)]
    argv += ["--namespace", pod.namespace, "--name", pod.name, "--netns", pod.netns]
    argv += ["--address", pod.ip, "--pod-pid", str(pod.process.pid)]
    argv += ["--pod-start", str(pod.process.start), "--pod-needle", pod.process.needle]
    if check.tcp_port is not None:
        argv += ["--tcp", str(check.tcp_port)]
    else:
        wrapped = exec_argv(pod.process.pid, pod.process.start, ["sh", "-c", str(check.command)])
        argv += ["--exec-json", json.dumps(wrapped)]
    argv += ["--period", f"{check.period:g}", "--timeout", f"{check.timeout:g}"]
    argv += ["--successes", str(check.successes), "--failures", str(check.failures)]
    return netns.command(state.nodes[pod.node].netns, argv)


def prober_needle(pod: PodRecord) -> str:
    """The piece of the prober's command line that only this pod's prober has."""
    return f"--netns {pod.netns} --address "


def start_prober(
    state: ClusterState, state_dir: Path, pod: PodRecord, check: ReadinessCheck
) -> ProcessRecord:
    """Start the pod's prober in the background; recorded by PID."""
    argv = prober_command(state, state_dir, pod, check)
    return spawn(argv, prober_log(state_dir, pod), prober_needle(pod))


def mark_running_ready(api: Any, pod: PodRecord) -> None:
    """Write Ready (and ContainersReady) True on a pod without a readiness check."""
    from podnet.model.kinds import POD

    old = api.get(POD, pod.namespace, pod.name).get("status")
    patch = {"status": readiness_status(True, True, rfc3339(datetime.now(UTC)), old)}
    api.patch(POD, pod.namespace, pod.name, patch, subresource="status")


def podwatch_needle(paths: NodePaths) -> str:
    return f"podnet.cluster.podwatch --kubeconfig {paths.kubeconfig} "


def ensure_exit_watcher(state: ClusterState, state_dir: Path, node_name: str) -> None:
    """Start the node's exit watcher (``podnet.cluster.podwatch``, one per node) unless it
    runs, and wait until it receives exit events: started before a pod's process, so no
    exit goes unseen."""
    node = state.nodes[node_name]
    if node.podwatch is not None and node.podwatch.alive():
        return
    paths = node_paths(state_dir, node.name)
    ready = ready_file(paths.root)
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "podnet.cluster.podwatch"]
    argv += ["--kubeconfig", str(paths.kubeconfig), "--node-dir", str(paths.root)]
    argv += ["--netns", node.netns]
    log = paths.root / "podwatch.log"
    watcher = node.podwatch = spawn(argv, log, podwatch_needle(paths))
    state.save(state_dir)
    deadline = time.monotonic() + WATCHER_TIMEOUT
    while not (ready.exists() and ready.read_text() == str(watcher.pid)):
        if time.monotonic() > deadline or not watcher.alive():
            raise RuntimeError(f"the exit watcher of {node.name} did not start; see {log}")
        time.sleep(0.02)


def watch_exit(state_dir: Path, pod: PodRecord) -> None:
    """Register the pod's process with its node's exit watcher."""
    if pod.process is None:
        raise ValueError(f"pod {pod.key} has no process to watch")
    register(node_paths(state_dir, pod.node).root, pod.namespace, pod.name, pod.process)


def unwatch_exit(state_dir: Path, pod: PodRecord) -> None:
    """Forget the pod at its node's watcher (before its process is stopped)."""
    unregister(node_paths(state_dir, pod.node).root, pod.namespace, pod.name)
