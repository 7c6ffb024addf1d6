"""Where and how the router's HAProxy runs: addresses, ports, files, limits and timeouts.

One frozen ``HAProxySettings`` is all the renderer and the driver need besides the
``RouterTable``. Every file HAProxy reads or creates lives in ``run_dir``: the generations
of rendered files (``gen-<n>``, with the ``current`` link naming the live one), the
sockets, the pid file and the server-state file.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

UNIX_PATH_MAX = 107  # sun_path holds 108 bytes, the last one a NUL
CURRENT = "current"  # the link to the live generation
CONFIG = "haproxy.cfg"
MAXCONN = 50000
FD_RESERVE = 200  # listeners, sockets, files


class SettingsError(ValueError):
    """Settings HAProxy could not run with (e.g. a socket path longer than sun_path)."""


@dataclass(frozen=True)
class HAProxySettings:
    """The router's HAProxy: what it listens on, where its files live, and its limits."""

    run_dir: Path
    default_certificate: Path  # PEM with certificate and key: served for unknown names
    bind_address: str = "0.0.0.0"
    http_port: int = 80
    https_port: int = 443
    maxconn: int = 0  # 0: OpenShift's 50000, or less if the open-file limit is lower
    timeout_connect: float = 5.0
    timeout_client: float = 30.0
    timeout_server: float = 30.0
    timeout_http_request: float = 10.0
    timeout_keep_alive: float = 300.0
    timeout_tunnel: float = 3600.0
    hard_stop_after: float = 30.0  # old workers are stopped this long after a reload
    reload_interval: float = 0.5  # coalescing: at least this many seconds between reloads
    # Keys the sticky cookies (a cookie names a server by a hash of its address and this
    # key); empty: the driver makes one and keeps it in run_dir.
    cookie_secret: str = ""
    haproxy: str = "/usr/sbin/haproxy"

    def __post_init__(self) -> None:
        files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        fit = (files - FD_RESERVE) // 2  # a proxied connection holds two descriptors
        if not self.maxconn:
            object.__setattr__(self, "maxconn", max(1, min(MAXCONN, fit)))
        elif self.maxconn > fit:
            raise SettingsError(
                f"maxconn {self.maxconn} needs more open files than the limit {files} allows "
                f"(at most {fit})"
            )
        for sock in (self.stats_socket, self.master_socket, self.sni_socket):
            if len(str(sock).encode()) > UNIX_PATH_MAX:
                raise SettingsError(f"run_dir {self.run_dir} is too long for a unix socket path")
        for port in (self.http_port, self.https_port):
            if not 0 < port < 65536:
                raise SettingsError(f"port {port} is out of range 1..65535")
        if self.reload_interval < 0 or self.hard_stop_after <= 0:
            raise SettingsError("reload_interval must be >= 0 and hard_stop_after > 0")

    @property
    def stats_socket(self) -> Path:
        """The runtime API (level admin, mode 600): the current worker's CLI."""
        return self.run_dir / "haproxy.sock"

    @property
    def master_socket(self) -> Path:
        """The master's CLI: ``reload``, ``show proc`` and commands routed to a worker."""
        return self.run_dir / "master.sock"

    @property
    def sni_socket(self) -> Path:
        """The hop from ``public_ssl`` to the TLS frontend for clients that sent SNI."""
        return self.run_dir / "fe_sni.sock"

    @property
    def no_sni_socket(self) -> Path:
        """The hop to the TLS frontend for clients without SNI (default certificate)."""
        return self.run_dir / "fe_no_sni.sock"

    @property
    def pid_file(self) -> Path:
        return self.run_dir / "haproxy.pid"

    @property
    def state_file(self) -> Path:
        """Server states saved before a reload and loaded by the new worker."""
        return self.run_dir / "server-state"

    @property
    def current(self) -> Path:
        """The link to the live generation directory."""
        return self.run_dir / CURRENT

    @property
    def config(self) -> Path:
        """The config HAProxy is started with (through the ``current`` link)."""
        return self.current / CONFIG
