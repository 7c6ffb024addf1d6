"""Start and stop etcd members bound to loopback, for tests and local clusters.

A member runs plain (tests' shared etcd) or with TLS: client-certificate auth on the
client port and on the peer port (``podnet.store.etcd_pki``). Several members with the
same ``initial_cluster`` form one cluster; a member restarted with the same ports and
data directory rejoins it with its data.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from podnet.store.etcd_pki import EtcdPki, EtcdTls

ETCD_BINARY = "/usr/bin/etcd"


class EtcdNotInstalled(RuntimeError):
    """The etcd binary is missing (install Debian's etcd-server)."""


LISTEN_PORTS_FLOOR = 10000  # listening ports are picked from here up to the ephemeral range


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds right now, *below* the ephemeral range.

    A process restarted on its recorded port (an etcd member after a crash) must find
    the port free. Inside the ephemeral range it may not: an outgoing connection can get
    it as its local port, and a peer that keeps dialing the dead member's loopback port
    can even connect to itself on it (TCP simultaneous open), so the restart fails with
    "address already in use". The kernel never picks local ports below the range.
    """
    low, _ = ephemeral_range()
    floor = min(LISTEN_PORTS_FLOOR, max(low - 1000, 1024))
    for _ in range(200):
        port = secrets.choice(range(floor, low))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {floor}-{low - 1}")


@dataclass
class EtcdProcess:
    """One etcd member with its data in ``data_dir``; stopped by PID, never by name.

    ``pki`` turns TLS on (client and peer, both with client-certificate auth);
    ``initial_cluster`` (``name=peer-url,...``) makes it one member of several.
    """

    data_dir: Path
    client_port: int
    peer_port: int
    process: subprocess.Popen[bytes] | None = None
    name: str = "podnet"
    pki: EtcdPki | None = None
    initial_cluster: str = ""
    cluster_token: str = "podnet"

    @property
    def scheme(self) -> str:
        return "https" if self.pki else "http"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command(self) -> list[str]:
        """etcd's command line: loopback only, TLS flags when ``pki`` is set."""
        client, peer = self.client_url, self.peer_url
        return [
            ETCD_BINARY,
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir / "etcd"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            self.initial_cluster or f"{self.name}={peer}",
            "--initial-cluster-token",
            self.cluster_token,
            "--initial-cluster-state",
            "new",  # ignored once the data directory exists (a restart)
            "--log-level",
            "warn",
            "--quota-backend-bytes",
            str(4 * 1024**3),
            *self._tls_flags(),
        ]

    def _tls_flags(self) -> list[str]:
        if self.pki is None:
            return []
        member, peer = self.pki.member(self.name), self.pki.peer(self.name)
        return [
            *("--cert-file", str(member.cert), "--key-file", str(member.key)),
            *("--trusted-ca-file", str(self.pki.ca), "--client-cert-auth"),
            *("--peer-cert-file", str(peer.cert), "--peer-key-file", str(peer.key)),
            *("--peer-trusted-ca-file", str(self.pki.peer_ca), "--peer-client-cert-auth"),
        ]

    def start(self, timeout: float = 15.0) -> None:
        """Start the member and wait until its client port listens."""
        if not Path(ETCD_BINARY).exists():
            raise EtcdNotInstalled(f"{ETCD_BINARY} not found: apt-get install etcd-server")
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.data_dir, 0o700)
        log = open(self.data_dir / "etcd.log", "ab")  # noqa: SIM115 - lives with the process
        self.process = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process and self.process.poll() is not None:
                raise RuntimeError(f"etcd exited early; see {self.data_dir / 'etcd.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.client_port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"etcd did not listen on {self.endpoint} within {timeout}s")

    def stop(self, remove_data: bool = False) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None
        if remove_data:
            shutil.rmtree(self.data_dir / "etcd", ignore_errors=True)


def start_etcd(data_dir: Path) -> EtcdProcess:
    """Start a fresh etcd on free loopback ports under ``data_dir``."""
    etcd = EtcdProcess(Path(data_dir), free_port(), free_port())
    etcd.start()
    return etcd


def health(client_url: str, tls: EtcdTls | None = None, timeout: float = 2.0) -> bool:
    """Whether the member at ``client_url`` answers ``/health`` with ``"health": "true"``
    (it does only while the cluster has a leader, i.e. quorum)."""
    context = None
    if tls is not None:
        context = ssl.create_default_context(cafile=str(tls.ca))
        context.load_cert_chain(str(tls.cert), str(tls.key))
    try:
        with urllib.request.urlopen(f"{client_url}/health", timeout=timeout, context=context) as r:
            return bool(json.loads(r.read()).get("health") in ("true", True))
    except (OSError, ValueError):
        return False


def wait_healthy(client_url: str, tls: EtcdTls | None, timeout: float = 30.0) -> None:
    """Block until the member reports health (raise ``TimeoutError`` otherwise)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if health(client_url, tls, timeout=1.0):
            return
        time.sleep(0.1)
    raise TimeoutError(f"etcd at {client_url} not healthy within {timeout}s")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
