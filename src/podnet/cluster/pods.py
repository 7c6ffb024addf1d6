"""Pods of the local cluster: a Pod object, a namespace wired by the real CNI plugin, and
one background process inside it.

``run_pod`` does what a kubelet and its runtime would: create the Pod (with
``spec.nodeName``), create the pod namespace ``pn-<id>-p-<hash>``, run the node's CNI
executable for ADD with the runtime's environment, and start the pod's command in the
namespace (by default the echo server on port 8080). ``delete_pod`` undoes it in reverse.
Everything is recorded in the cluster state first, so ``cluster down`` removes it too.

Pod processes (the command and every ``exec``) run in a sandbox (``podnet.cluster.sandbox``):
the pod's own mount, PID and IPC namespaces, in which the cluster's state directory and
podnet's default directories are hidden and ``/tmp`` and ``/dev/shm`` are the pod's own,
as a uid of the pod's own (``podnet.cluster.poduids``) with no capabilities unless the
pod is ``privileged`` (root), with a minimal environment, and the host directories given
as its volumes (``podnet.cluster.podvolumes``). The pod namespace lets unprivileged
processes bind ports below 1024 and ping.

Container ports (``(name or None, port, protocol)``) go into the Pod's
``spec.containers[0].ports``, where NetworkPolicy named ports find them; the default echo
command then serves TCP and UDP echo on every TCP or UDP port given (SCTP ports are only
declared: this kernel has no SCTP sockets).
"""

from __future__ import annotations

import hashlib
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podnet import netns
from podnet.cluster.podcni import PodError as PodError
from podnet.cluster.podcni import cni_call, result_dns, result_ip
from podnet.cluster.podcni import cni_env as cni_env
from podnet.cluster.podcni import plugin_config as plugin_config
from podnet.cluster.podenv import load_environment, namespace_service_environment, save_environment
from podnet.cluster.podprocess import (
    PodProcessError,
    exec_command,
    pod_environment,
    start_command,
    stop_pod_processes,
)
from podnet.cluster.podready import (
    ensure_exit_watcher,
    mark_running_ready,
    start_prober,
    unwatch_exit,
    watch_exit,
)
from podnet.cluster.podresolv import remove_resolv_conf, write_resolv_conf
from podnet.cluster.podvolumes import Volume, check_volumes
from podnet.cluster.readiness import ReadinessCheck
from podnet.cluster.sandbox import POD_SYSCTLS
from podnet.cluster.state import ClusterState, PodRecord, locked
from podnet.cluster.underlay import tcp_listens
from podnet.cni.dnsconfig import DnsConfigError, resolv_conf
from podnet.model.schemas_names import iana_service_name_problem

if TYPE_CHECKING:
    from podnet.client.sync import ApiClient

Say = Callable[[str], None]
ECHO_COMMAND = (sys.executable, "-m", "podnet.cluster.echo")
ECHO_PORT = 8080
ECHO_PROTOCOLS = ("TCP", "UDP")
PORT_PROTOCOLS = ("TCP", "UDP", "SCTP")
ContainerPort = tuple[str | None, int, str]  # (name or None, containerPort, protocol)


def pod_netns_name(state: ClusterState, namespace: str, name: str) -> str:
    """The pod's namespace: the cluster prefix and a short hash of ``namespace/name``."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:10]
    return f"{state.prefix()}-p-{digest}"


def choose_node(state: ClusterState) -> str:
    """The node with the fewest pods (the lowest index on a tie)."""
    if not state.nodes:
        raise PodError("the cluster has no nodes: run `podnet cluster up --nodes N`")
    counts = {name: 0 for name in state.nodes}
    for pod in state.pods.values():
        counts[pod.node] = counts.get(pod.node, 0) + 1
    return min(state.nodes.values(), key=lambda n: (counts[n.name], n.index)).name


def admin_api(state_dir: Path) -> ApiClient:
    """An API client with the cluster's admin kubeconfig."""
    from podnet.client.sync import ApiClient
    from podnet.kubeconfig import load_client_config

    return ApiClient(load_client_config(str(state_dir / "master" / "admin.kubeconfig")))


def check_ports(ports: Sequence[ContainerPort]) -> list[ContainerPort]:
    """The ports with protocols upper-cased; PodError for a bad or repeated one."""
    checked: list[ContainerPort] = []
    for name, number, protocol in ports:
        protocol = protocol.upper()
        if protocol not in PORT_PROTOCOLS:
            raise PodError(f"port {number}: protocol {protocol!r} is not TCP, UDP or SCTP")
        if not 1 <= number <= 65535:
            raise PodError(f"port {number} is not in 1..65535")
        if name is not None and (why := iana_service_name_problem(name)):
            raise PodError(f"port name {name!r} {why}")
        checked.append((name, number, protocol))
    _check_unique(checked)
    return checked


def _check_unique(ports: Sequence[ContainerPort]) -> None:
    names = [name for name, _, _ in ports if name is not None]
    for name in dict.fromkeys(n for n in names if names.count(n) > 1):
        raise PodError(f"port name {name!r} is used twice")
    pairs = [(number, protocol) for _, number, protocol in ports]
    for number, protocol in dict.fromkeys(p for p in pairs if pairs.count(p) > 1):
        raise PodError(f"port {number}/{protocol} is given twice")


def echo_ports(ports: Sequence[ContainerPort]) -> list[int]:
    """The ports the echo server serves: every TCP or UDP port, else the default 8080."""
    served = [number for _, number, protocol in ports if protocol.upper() in ECHO_PROTOCOLS]
    return list(dict.fromkeys(served)) or [ECHO_PORT]


def echo_command(ports: Sequence[ContainerPort]) -> tuple[str, ...]:
    """The default command, serving ``echo_ports(ports)``."""
    served = echo_ports(ports)
    if served == [ECHO_PORT]:
        return ECHO_COMMAND
    return (*ECHO_COMMAND, *(arg for port in served for arg in ("--port", str(port))))


def container_ports(ports: Sequence[ContainerPort]) -> list[dict[str, Any]]:
    """The ports as ``spec.containers[].ports`` entries."""
    entries: list[dict[str, Any]] = []
    for name, number, protocol in ports:
        entry: dict[str, Any] = {"name": name} if name else {}
        entries.append({**entry, "containerPort": number, "protocol": protocol.upper()})
    return entries


def pod_object(
    pod: PodRecord,
    command: Sequence[str],
    ports: Sequence[ContainerPort] = (),
    readiness: ReadinessCheck | None = None,
) -> dict[str, Any]:
    """The Pod as the API stores it (its readiness check as the ``readinessProbe``)."""
    container: dict[str, Any] = {"name": "main", "image": "podnet/local", "command": list(command)}
    if ports:
        container["ports"] = container_ports(ports)
    if readiness is not None:
        container["readinessProbe"] = readiness.probe_spec()
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": pod.labels},
        # The local runtime never restarts a process: a pod that ended stays ended.
        "spec": {"nodeName": pod.node, "containers": [container], "restartPolicy": "Never"},
    }


def ensure_namespace(api: Any, namespace: str) -> None:
    """Create the Namespace object unless it exists."""
    from podnet.client import StatusError
    from podnet.model.kinds import NAMESPACE

    try:
        api.get(NAMESPACE, None, namespace)
    except StatusError as exc:
        if exc.code != 404:
            raise
        obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        api.create(NAMESPACE, obj)


def pod_log(state_dir: Path, pod: PodRecord) -> Path:
    return state_dir / "pods" / f"{pod.namespace}_{pod.name}.log"


def pod_env_file(state_dir: Path, pod: PodRecord) -> Path:
    return state_dir / "pods" / f"{pod.namespace}_{pod.name}.env.json"


def run_pod(
    state_dir: Path,
    name: str,
    namespace: str = "default",
    node: str | None = None,
    labels: Mapping[str, str] | None = None,
    command: Sequence[str] = ECHO_COMMAND,
    ports: Sequence[ContainerPort] = (),
    privileged: bool = False,
    readiness: ReadinessCheck | None = None,
    volumes: Sequence[Volume] = (),
) -> PodRecord:
    """Create, wire and start one pod; roll back what was done if a step fails.

    With the default command the echo server serves ``echo_ports(ports)``, and the call
    returns once it listens on each of them. The command runs as a uid of its own in
    the pod sandbox, or as root (still with podnet's directories hidden) when ``privileged``,
    with the cluster DNS in its resolv.conf and its namespace's service variables. The
    Pod is Ready once its process runs, or, with ``readiness``, as its prober finds.
    Each of ``volumes`` (host directory, directory in the pod) is bound in, if
    ``podnet.cluster.podvolumes`` allows it (PodError before anything is done if not).
    """
    bound = check_volumes(volumes, state_dir)
    launch = _Launch(tuple(command), check_ports(ports), privileged, readiness, bound)
    with locked(state_dir):
        state = _loaded(state_dir)
        pod = _new_pod(state, name, namespace, node, labels)
        state.pods[pod.key] = pod
        state.save(state_dir)
        try:
            _start_pod(state, state_dir, pod, launch)
        except BaseException:
            _teardown_pod(state, state_dir, pod, lambda _line: None)
            raise
        return pod


def _loaded(state_dir: Path) -> ClusterState:
    state = ClusterState.load(state_dir)
    if state is None or not state.cluster_id:
        raise PodError(f"no cluster at {state_dir}: run `podnet cluster up`")
    return state


def _new_pod(
    state: ClusterState,
    name: str,
    namespace: str,
    node: str | None,
    labels: Mapping[str, str] | None,
) -> PodRecord:
    if f"{namespace}/{name}" in state.pods:
        raise PodError(f"pod {namespace}/{name} already exists")
    node = node or choose_node(state)
    if node not in state.nodes:
        raise PodError(f"no node {node!r} (nodes: {', '.join(state.nodes)})")
    cid = secrets.token_hex(32)
    netns_name = pod_netns_name(state, namespace, name)
    return PodRecord(name, namespace, node, netns_name, cid, labels=dict(labels or {}))


class _Launch:
    """What a pod runs: its command (the echo server serving its ports), ports, volumes."""

    def __init__(
        self,
        command: tuple[str, ...],
        ports: list[ContainerPort],
        privileged: bool,
        readiness: ReadinessCheck | None = None,
        volumes: tuple[Volume, ...] = (),
    ) -> None:
        is_echo = command == ECHO_COMMAND
        self.volumes = volumes
        self.command = echo_command(ports) if is_echo else command
        self.ports = ports
        self.listening = echo_ports(ports) if is_echo else []
        self.privileged = privileged
        self.readiness = readiness


def _start_pod(state: ClusterState, state_dir: Path, pod: PodRecord, launch: _Launch) -> None:
    with admin_api(state_dir) as api:
        from podnet.model.kinds import POD

        ensure_namespace(api, pod.namespace)
        obj = pod_object(pod, launch.command, launch.ports, launch.readiness)
        api.create(POD, obj, namespace=pod.namespace)
        env = namespace_service_environment(api, pod.namespace)
    save_environment(pod_env_file(state_dir, pod), env)
    state.record_netns(pod.netns, state_dir)
    netns.create(pod.netns)
    netns.run(pod.netns, ["sysctl", "-qw", *POD_SYSCTLS], check=True)
    added = cni_call(state_dir, pod, "ADD")
    pod.ip = result_ip(added)
    state.save(state_dir)
    _write_resolv_conf(pod, added)
    ensure_exit_watcher(state, state_dir, pod.node)
    try:
        log = pod_log(state_dir, pod)
        pod.process = start_command(
            state_dir, pod, launch.command, launch.privileged, log, env, launch.volumes
        )
    except PodProcessError as exc:
        raise PodError(str(exc)) from exc
    state.save(state_dir)
    watch_exit(state_dir, pod)
    for port in launch.listening:
        wait_listening(pod, port)
    _start_readiness(state, state_dir, pod, launch)


def _write_resolv_conf(pod: PodRecord, added: Mapping[str, Any]) -> None:
    """The pod namespace's resolv.conf, from the DNS settings of the ADD result."""
    try:
        write_resolv_conf(pod.netns, resolv_conf(result_dns(added, pod.namespace)))
    except DnsConfigError as exc:
        raise PodError(f"pod {pod.key}: the CNI result's DNS settings: {exc}") from exc


def _start_readiness(state: ClusterState, state_dir: Path, pod: PodRecord, launch: _Launch) -> None:
    """Ready now (no check), or the pod's prober started (recorded)."""
    if launch.readiness is None:
        with admin_api(state_dir) as api:
            mark_running_ready(api, pod)
        return
    pod.prober = start_prober(state, state_dir, pod, launch.readiness)
    state.save(state_dir)


def wait_listening(pod: PodRecord, port: int, timeout: float = 15.0) -> None:
    """Wait until the pod's process accepts TCP connections on ``port`` (its own view)."""
    deadline = time.monotonic() + timeout
    while not tcp_listens(pod.netns, port):
        if pod.process is None or not pod.process.alive():
            raise PodError(f"the process of pod {pod.key} exited; see its log")
        if time.monotonic() > deadline:
            raise PodError(f"pod {pod.key} does not listen on port {port} after {timeout}s")
        time.sleep(0.05)


def _teardown_pod(state: ClusterState, state_dir: Path, pod: PodRecord, say: Say) -> None:
    """Stop the process, CNI DEL, remove the netns and the Pod object; forget the pod."""
    from podnet.client import ClientError
    from podnet.model.kinds import POD

    if pod.prober is not None:
        pod.prober.stop(timeout=5)
    unwatch_exit(state_dir, pod)
    if pod.process is not None:
        stop_pod_processes(pod.process, timeout=5)
    try:
        cni_call(state_dir, pod, "DEL")
    except (PodError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        say(f"warning: {exc}")
    netns.remove(pod.netns)
    remove_resolv_conf(pod.netns)
    pod_env_file(state_dir, pod).unlink(missing_ok=True)
    try:
        with admin_api(state_dir) as api:
            # its sandbox is gone (DEL above): the node's final delete, at once
            api.delete(POD, pod.namespace, pod.name, grace_period_seconds=0)
    except ClientError as exc:
        if getattr(exc, "code", 0) != 404:
            say(f"warning: deleting Pod {pod.key}: {exc}")
    state.pods.pop(pod.key, None)
    if pod.netns in state.namespaces:
        state.namespaces.remove(pod.netns)
    state.save(state_dir)


def delete_pod(state_dir: Path, name: str, namespace: str = "default", say: Say = print) -> None:
    """Undo ``run_pod``: process, CNI DEL, namespace, Pod object."""
    with locked(state_dir):
        state = _loaded(state_dir)
        pod = find_pod(state, name, namespace)
        _teardown_pod(state, state_dir, pod, say)


def find_pod(state: ClusterState, name: str, namespace: str = "default") -> PodRecord:
    """The recorded pod, or PodError."""
    pod = state.pods.get(f"{namespace}/{name}")
    if pod is None:
        raise PodError(f"no pod {namespace}/{name} in this cluster")
    return pod


def exec_pod(
    state_dir: Path,
    name: str,
    argv: Sequence[str],
    namespace: str = "default",
    capture: bool = True,
    timeout: float | None = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside the running pod (its namespaces and sandbox, as the user its
    process runs as), with the service variables it started with, and wait for it;
    PodError when the pod's process has ended (as ``kubectl exec`` refuses)."""
    pod = find_pod(_loaded(state_dir), name, namespace)
    if pod.process is None or not pod.process.alive():
        raise PodError(f"pod {pod.key}: its process has ended; there is nothing to exec into")
    return subprocess.run(
        exec_command(pod.process, argv),
        capture_output=capture,
        text=True,
        timeout=timeout,
        env={**load_environment(pod_env_file(state_dir, pod)), **pod_environment()},
    )
