"""The router's processes in the local cluster: waiting for its listeners, the apps
domain's resolver on the external host, and stopping what runs in the router pod's
network namespace.

A router that dies without stopping HAProxy (SIGKILL) leaves HAProxy's master and worker
running in the pod's namespace. ``stop_in_netns`` finds those processes by that exact
namespace (the inode of ``/proc/<pid>/ns/net`` equal to the named namespace's), never by
name, and stops them: the pod namespace is this cluster's, so whatever runs in it is too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from podnet import netns
from podnet.cluster.podcni import PodError
from podnet.cluster.podresolv import write_resolv_conf
from podnet.cluster.pods import wait_listening
from podnet.cluster.state import ClusterState, PodRecord, RouterRecord, spawn, wait_exited
from podnet.cluster.underlay import external_netns, tcp_listens

LISTEN_TIMEOUT = 60.0
DNS_NEEDLE = "podnet.cluster.appsdns --domain"


def wait_router_listening(pod: PodRecord, ports: Sequence[int]) -> None:
    """Until the router accepts TCP on each of ``ports`` in its pod (HAProxy is up)."""
    for port in ports:
        wait_listening(pod, port, LISTEN_TIMEOUT)


def netns_inode(path: Path) -> int:
    """The inode of a network namespace file (0 if it cannot be read)."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return 0


def pids_in_netns(name: str) -> list[int]:
    """Every process whose network namespace is the named one."""
    wanted = netns_inode(netns.path(name))
    if not wanted:
        return []
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and netns_inode(Path(entry.path) / "ns" / "net") == wanted:
            found.append(int(entry.name))
    return sorted(found)


def stop_in_netns(name: str, timeout: float = 10.0) -> list[int]:
    """SIGTERM every process in the named namespace, SIGKILL what is left after
    ``timeout``; the PIDs that were there."""
    pids = pids_in_netns(name)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(p in pids_in_netns(name) for p in pids):
            time.sleep(0.05)
        if not any(p in pids_in_netns(name) for p in pids):
            break
    for pid in pids:
        with contextlib.suppress(TimeoutError):
            wait_exited(pid, 2)
    return pids


def ensure_apps_dns(state: ClusterState, state_dir: Path, record: RouterRecord, log: Path) -> None:
    """The apps domain's resolver on the external host's loopback, and the external
    host's resolv.conf naming it (idempotent)."""
    ext = external_netns(state)
    write_resolv_conf(ext, "nameserver 127.0.0.1\noptions timeout:1 attempts:2\n")
    if record.dns is not None and record.dns.alive():
        return
    argv = [sys.executable, "-m", "podnet.cluster.appsdns", "--domain", record.domain]
    argv += ["--address", record.address]
    record.dns = spawn(netns.command(ext, argv), log, DNS_NEEDLE)
    state.save(state_dir)
    deadline = time.monotonic() + 15
    while not resolver_answers(ext, record.domain):
        if time.monotonic() > deadline or not record.dns.alive():
            raise PodError(f"the apps domain resolver did not start; see {log}")
        time.sleep(0.05)


def resolver_answers(namespace: str, domain: str) -> bool:
    """Whether the resolver on ``namespace``'s loopback answers a name under ``domain``."""
    from dnslib import DNSRecord

    with netns.entered(namespace):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        sock.settimeout(0.2)
        try:
            sock.sendto(DNSRecord.question(f"probe.{domain}").pack(), ("127.0.0.1", 53))
            return bool(sock.recv(512))
        except OSError:
            return False


@dataclass(frozen=True)
class RouterHealth:
    """What ``cluster status`` shows for the router."""

    pod: str
    node: str
    address: str
    domain: str
    pid: int
    alive: bool
    listening: dict[int, bool]
    dns_alive: bool

    @property
    def ok(self) -> bool:
        return self.alive and all(self.listening.values()) and self.dns_alive

    def text(self) -> str:
        process = f"pid {self.pid} {'running' if self.alive else 'DOWN'}"
        ports = ", ".join(
            f"{port} {'ok' if up else 'CLOSED'}" for port, up in sorted(self.listening.items())
        )
        dns = "ok" if self.dns_alive else "DOWN"
        return (
            f"{self.pod} on {self.node} {self.address} ({process}; ports {ports}); "
            f"*.{self.domain} resolver {dns}; {'healthy' if self.ok else 'UNHEALTHY'}"
        )


def router_health(state: ClusterState, ports: Sequence[int] = (80, 443)) -> RouterHealth:
    """The router's process, its listeners in its pod and the apps resolver."""
    record = state.router
    assert record is not None
    pod = state.pods.get(record.pod)
    alive = bool(pod and pod.process and pod.process.alive())
    listening = {
        port: bool(pod and netns.exists(pod.netns) and tcp_listens(pod.netns, port))
        for port in ports
    }
    return RouterHealth(
        record.pod,
        record.node,
        record.address,
        record.domain,
        pod.process.pid if pod and pod.process else 0,
        alive,
        listening,
        bool(record.dns and record.dns.alive()),
    )
