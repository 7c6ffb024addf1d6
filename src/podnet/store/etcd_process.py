"""Start and stop a single-member etcd bound to loopback, for tests and local clusters."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ETCD_BINARY = "/usr/bin/etcd"


class EtcdNotInstalled(RuntimeError):
    """The etcd binary is missing (install Debian's etcd-server)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EtcdProcess:
    """One etcd member with its data in ``data_dir``; stopped by PID, never by name."""

    data_dir: Path
    client_port: int
    peer_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            ETCD_BINARY,
            "--name",
            "podnet",
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
            f"podnet={peer}",
            "--log-level",
            "warn",
            "--quota-backend-bytes",
            str(4 * 1024**3),
        ]

    def start(self, timeout: float = 15.0) -> None:
        if not Path(ETCD_BINARY).exists():
            raise EtcdNotInstalled(f"{ETCD_BINARY} not found: apt-get install etcd-server")
        self.data_dir.mkdir(parents=True, exist_ok=True)
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


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
