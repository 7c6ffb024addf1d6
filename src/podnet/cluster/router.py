"""The local cluster's router (``podnet cluster up --router``): OpenShift's HAProxy router
as a pod of the ``default`` project, published on one node's underlay address.

- **The pod.** ``default/router`` on ``node1``, wired by the real CNI plugin like every
  pod: its own network namespace and a pod IP of the ``default`` project, which has VNID
  0 in multitenant mode, so it reaches every project's pods while isolated projects stay
  isolated from each other (seed 004). Its process is ``podnet router`` (which drives
  HAProxy), run as root in the pod sandbox (a privileged pod, as OpenShift's router is),
  with the cluster's state hidden except its own files: the volume
  ``<state>/router/volume``, seen at ``ROUTER_MOUNT``, holds its kubeconfig (the
  restricted identity ``system:podnet:router:default``, API at ``default/kubernetes``'
  cluster IP, reached as pods reach it) and HAProxy's run directory.
- **hostPorts.** The Pod declares ``hostPort`` 80 and 443; the node's CNI chain's
  ``portmap`` plugin publishes them (``podnet.cluster.hostports``): DNAT rules in the node's
  namespace only, from the node's addresses to the pod.
- **The name.** ``*.<apps domain>`` resolves to that node address from the external host
  (``podnet.cluster.appsdns``, on the external host's loopback, named by its
  ``/etc/netns/<ext>/resolv.conf``).

``ensure_router`` is idempotent: a running router is kept; a missing piece is made again.
``stop_router`` stops its processes by PID, and anything left in the router pod's network
namespace (HAProxy, if the router died without stopping it), found by that namespace's
identity; ``cluster down`` then removes the namespaces as for any pod.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from podnet import netns
from podnet.cluster.appsdns import DEFAULT_DOMAIN
from podnet.cluster.hostports import HostPort, call_portmap
from podnet.cluster.podcni import PodError, cni_call, result_dns, result_ip
from podnet.cluster.podprocess import pod_sandbox, spawn_in_pod
from podnet.cluster.podready import mark_running_ready
from podnet.cluster.podresolv import write_resolv_conf
from podnet.cluster.pods import admin_api, pod_log, pod_netns_name
from podnet.cluster.routerprocs import (
    ensure_apps_dns,
    stop_in_netns,
    wait_router_listening,
)
from podnet.cluster.state import ClusterState, PodRecord, RouterRecord
from podnet.cluster.underlay import node_address
from podnet.cni.dnsconfig import resolv_conf

Say = Callable[[str], None]

ROUTER_NAME = "router"
ROUTER_NAMESPACE = "default"
ROUTER_NODE_INDEX = 1
ROUTER_IDENTITY = "default"  # routerName in status.ingress; user system:podnet:router:default
METRICS_PORT = 1936  # OpenShift's router stats port; here on the pod's loopback only
ROUTER_MOUNT = Path("/mnt")  # where the router pod sees its volume
HOST_PORTS = {"http": HostPort(80, 80), "https": HostPort(443, 443)}
POD_LABELS = {"app": "router"}


@dataclasses.dataclass(frozen=True)
class RouterPaths:
    """The router's files: its volume (bound into the pod at ``ROUTER_MOUNT``) with its
    kubeconfig, and what the cluster keeps beside it: the pod's CNI ADD result
    (portmap's ``prevResult`` on a later ensure) and the apps resolver's log."""

    volume: Path
    kubeconfig: Path
    cni_result: Path
    dns_log: Path


def router_paths(state_dir: Path) -> RouterPaths:
    root = state_dir / "router"
    volume = root / "volume"
    return RouterPaths(
        volume, volume / "router.kubeconfig", root / "cni-result.json", root / "appsdns.log"
    )


def router_command() -> tuple[str, ...]:
    """``podnet router`` as the pod runs it, with paths inside the pod; its metrics on
    the pod's loopback only."""
    inside = ROUTER_MOUNT
    return (
        sys.executable,
        "-m",
        "podnet",
        "--kubeconfig",
        str(inside / "router.kubeconfig"),
        "router",
        "--name",
        ROUTER_IDENTITY,
        "--run-dir",
        str(inside / "haproxy"),
        "--metrics",
        f"127.0.0.1:{METRICS_PORT}",
    )


def router_pod_object(pod: PodRecord, command: tuple[str, ...]) -> dict[str, Any]:
    """The router Pod: its hostPorts declared, privileged, on its node."""
    ports = [port.container_port(name) for name, port in HOST_PORTS.items()]
    container = {
        "name": "router",
        "image": "podnet/local",
        "command": list(command),
        "ports": ports,
        "securityContext": {"privileged": True},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": dict(pod.labels)},
        "spec": {"nodeName": pod.node, "containers": [container], "restartPolicy": "Never"},
    }


def ensure_router(state: ClusterState, state_dir: Path, say: Say) -> RouterRecord:
    """The router pod, its hostPorts, its process and the apps domain (idempotent)."""
    node = f"node{ROUTER_NODE_INDEX}"
    if node not in state.nodes:
        raise PodError(f"the router runs on {node}: the cluster has no such node")
    paths = router_paths(state_dir)
    paths.volume.mkdir(parents=True, exist_ok=True, mode=0o700)
    address = str(node_address(state, ROUTER_NODE_INDEX).ip)
    key = f"{ROUTER_NAMESPACE}/{ROUTER_NAME}"
    record = state.router or RouterRecord(key, node, address, DEFAULT_DOMAIN)
    state.router = record
    state.save(state_dir)
    _write_credentials(state_dir, paths)
    pod = state.pods.get(key)
    if pod is None or not pod.ip or not netns.exists(pod.netns):
        if pod is not None:
            _release(state, state_dir, pod, paths, say)
        pod = _wire_pod(state, state_dir, node, paths)
    _publish(state, state_dir, pod, paths)
    started = pod.process is None or not pod.process.alive()
    if started:  # a router that died took its HAProxy along: its pod's PID namespace ended
        _start_process(state, state_dir, pod, paths)
    wait_router_listening(pod, [port.container for port in HOST_PORTS.values()])
    with admin_api(state_dir) as api:
        mark_running_ready(api, pod)
    ensure_apps_dns(state, state_dir, record, paths.dns_log)
    pid = pod.process.pid if pod.process else 0
    how = "started" if started else "already running"
    say(f"router {key} on {node} ({pod.ip}) {how} (pid {pid}): http://{address}, https://{address}")
    say(f"apps domain *.{record.domain} -> {address} (resolver on {state.prefix()}-ext)")
    return record


def _write_credentials(state_dir: Path, paths: RouterPaths) -> None:
    """The router's kubeconfig, for the API at ``default/kubernetes``' cluster IP."""
    from podnet.master import router_credentials
    from podnet.model.kinds import SERVICE

    with admin_api(state_dir) as api:
        service_ip = api.get(SERVICE, "default", "kubernetes")["spec"]["clusterIP"]
    server = f"https://{service_ip}:443"
    router_credentials(
        state_dir / "master", ROUTER_IDENTITY, kubeconfig=paths.kubeconfig, server=server
    )


def _wire_pod(state: ClusterState, state_dir: Path, node: str, paths: RouterPaths) -> PodRecord:
    """The Pod object, the pod namespace and CNI ADD (recorded before each step)."""
    from podnet.cluster.sandbox import POD_SYSCTLS
    from podnet.model.kinds import POD

    netns_name = pod_netns_name(state, ROUTER_NAMESPACE, ROUTER_NAME)
    pod = PodRecord(
        ROUTER_NAME, ROUTER_NAMESPACE, node, netns_name, secrets.token_hex(32), labels=POD_LABELS
    )
    state.pods[pod.key] = pod
    state.save(state_dir)
    with admin_api(state_dir) as api:
        if not _pod_exists(api, pod):
            api.create(POD, router_pod_object(pod, router_command()), namespace=pod.namespace)
    state.record_netns(pod.netns, state_dir)
    netns.create(pod.netns)
    netns.run(pod.netns, ["sysctl", "-qw", *POD_SYSCTLS], check=True)
    added = cni_call(state_dir, pod, "ADD")
    pod.ip = result_ip(added)
    paths.cni_result.write_text(json.dumps({"containerID": pod.container_id, "result": added}))
    state.save(state_dir)
    write_resolv_conf(pod.netns, resolv_conf(result_dns(added, pod.namespace)))
    return pod


def _pod_exists(api: Any, pod: PodRecord) -> bool:
    from podnet.client import StatusError
    from podnet.model.kinds import POD

    try:
        api.get(POD, pod.namespace, pod.name)
    except StatusError as exc:
        if exc.code != 404:
            raise
        return False
    return True


def _publish(state: ClusterState, state_dir: Path, pod: PodRecord, paths: RouterPaths) -> None:
    """The hostPorts on the node (portmap ADD: idempotent)."""
    added = json.loads(paths.cni_result.read_text())["result"]
    node_netns = state.nodes[pod.node].netns
    call_portmap(state_dir, node_netns, pod, "ADD", list(HOST_PORTS.values()), added)


def _release(
    state: ClusterState, state_dir: Path, old: PodRecord, paths: RouterPaths, say: Say
) -> None:
    """Before the router pod is made again (its namespace was lost): the old pod's
    hostPort rules (they would still DNAT to its address) and its address, freed."""
    try:
        recorded = json.loads(paths.cni_result.read_text())
        if recorded["containerID"] == old.container_id and old.node in state.nodes:
            node_netns = state.nodes[old.node].netns
            ports = list(HOST_PORTS.values())
            call_portmap(state_dir, node_netns, old, "DEL", ports, recorded["result"])
        cni_call(state_dir, old, "DEL")
    except (OSError, ValueError, KeyError, PodError, subprocess.SubprocessError) as exc:
        say(f"warning: releasing the old router pod {old.key}: {exc}")


def _start_process(
    state: ClusterState, state_dir: Path, pod: PodRecord, paths: RouterPaths
) -> None:
    """``podnet router`` in the pod: privileged, its volume bound, the rest hidden."""
    sandbox = pod_sandbox(state_dir, privileged=True, netns_name=pod.netns)
    sandbox = dataclasses.replace(sandbox, volumes=((paths.volume, ROUTER_MOUNT),))
    pod.process = spawn_in_pod(pod, sandbox, router_command(), pod_log(state_dir, pod))
    state.save(state_dir)


def stop_router(state: ClusterState, say: Say) -> None:
    """Stop the router's process, what is left in its namespace, and the apps resolver."""
    record = state.router
    if record is None:
        return
    pod = state.pods.get(record.pod)
    if pod is not None:
        if pod.process and pod.process.stop(timeout=10):
            say(f"router {pod.key} stopped (pid {pod.process.pid})")
        for pid in stop_in_netns(pod.netns):
            say(f"router {pod.key}: stopped pid {pid} left in its namespace")
    if record.dns and record.dns.stop(timeout=5):
        say(f"apps domain resolver stopped (pid {record.dns.pid})")
