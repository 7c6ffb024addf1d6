"""A real ``podnet master`` as a child process: the local cluster's control plane runs its
masters this way, and tests and benchmarks start theirs with it (``podnet.testing.processes``)."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from podnet.store.etcd_pki import EtcdTls
from podnet.store.etcd_process import free_port


@dataclass
class MasterProcess:
    """A ``podnet master`` child bound to 127.0.0.1, stopped by PID.

    ``etcd`` is one endpoint or several, comma-separated; ``etcd_tls`` the client
    certificate for a TLS etcd.
    """

    etcd: str
    state_dir: Path
    prefix: str
    port: int = field(default_factory=free_port)
    args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    etcd_tls: EtcdTls | None = None
    log_name: str = "master.log"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "admin.kubeconfig"

    @property
    def log_path(self) -> Path:
        return self.state_dir / self.log_name

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "podnet",
            "master",
            "--etcd",
            self.etcd,
            "--etcd-prefix",
            self.prefix,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--state-dir",
            str(self.state_dir),
            *self._tls_args(),
            *self.args,
        ]

    def _tls_args(self) -> list[str]:
        tls = self.etcd_tls
        if tls is None:
            return []
        return [
            *("--etcd-cafile", str(tls.ca)),
            *("--etcd-certfile", str(tls.cert), "--etcd-keyfile", str(tls.key)),
        ]

    def start(self, timeout: float = 30.0, wait: bool = True) -> MasterProcess:
        """Start it; with ``wait``, block until /readyz answers 200."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0, path: str = "/readyz") -> None:
        """Block until ``path`` answers 200 (``/healthz``: serving; ``/readyz``: serving
        with etcd, once the cluster is set up, standbys too; ``/leaderz``: leading with
        synced controllers)."""
        deadline = time.monotonic() + timeout
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"master exited early:\n{self.log()}")
            try:
                url = f"{self.server}{path}"
                with urllib.request.urlopen(url, timeout=1, context=context) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"master not ready within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None
