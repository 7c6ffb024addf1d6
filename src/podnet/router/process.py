"""``podnet router``: the router process, from start to a clean stop.

Start:

1. The run directory (``--run-dir``) is the router's own: made 0700, it holds HAProxy's
   generations (config, maps, route certificates and keys), its sockets, pid file and
   log, and the default certificate when none is given. A directory holding anything
   else is refused, so a mistyped ``--run-dir`` never loses a file at the stop; so is
   one another running router holds (``router.lock``, flock).
2. The default certificate: ``--default-certificate`` checked, else a self-signed one;
   HAProxy checks the configuration without routes (``haproxy -c``), so what no route
   can fix fails the start.
3. The controller (``podnet.router.controller``), its status writer and the metrics
   listener (``--metrics``, the loopback by default).
4. HAProxy (``podnet.router.haproxy.HAProxyRouter``) starts with the controller's first
   table, once Routes, Services and EndpointSlices have listed, or adopts the master a
   killed router left running for this run directory (found by the pid file and checked
   by its command line, never by a name pattern), which serves its last routes until
   then.

Stop (SIGTERM, SIGINT): the controller and writers end, HAProxy is stopped by PID (soft
stop, then TERM, then KILL), and the run directory is removed: no process, socket, key
or pid file is left. A task that fails for good (the API refusing the router's
identity, say) is logged and stops the process the same way, which then exits 1 with
that error.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import re
import shutil
import signal
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podnet.agent.metrics import MetricsServer, split_address
from podnet.client.errors import ClientError
from podnet.client.informers import Informers
from podnet.controllers.remote import RemoteApi
from podnet.controllers.workqueue import cancel_all
from podnet.kubeconfig import ClientConfig
from podnet.router.controller import RouterController
from podnet.router.defaultcert import ensure_default_certificate, load_default_certificate
from podnet.router.haproxy import ConfigRejected, HAProxyRouter, HAProxySettings
from podnet.router.metrics import ReloadFigures, RouteCounts, RouteKey, RouterMetrics
from podnet.router.routestatus import RouteStatusWriter
from podnet.router.table import RouterTable

log = logging.getLogger("podnet.router")

DEFAULT_CERTIFICATE = "default.pem"  # made in the run dir when none is given
LOCK = "router.lock"  # held while a router runs with the run dir
# What the router and HAProxy keep in the run directory (anything else: not ours).
RUN_FILES = re.compile(
    r"^(gen-\d+|current|\.current\.tmp|rejected|haproxy\.(pid|sock|log)|master\.sock"
    r"|fe_(no_)?sni\.sock|server-state|cookie-secret|default\.pem|router\.lock)$"
)


@dataclass(frozen=True)
class RouterOptions:
    """``podnet router``'s flags."""

    client: ClientConfig
    name: str = "default"
    bind: str = "0.0.0.0"
    http_port: int = 80
    https_port: int = 443
    run_dir: Path = Path("/run/podnet/router")
    default_certificate: Path | None = None
    metrics_address: str = "127.0.0.1:1936"
    reload_interval: float = 0.5
    resync_period: float = 300.0


def foreign_files(run_dir: Path) -> list[str]:
    """The names in ``run_dir`` the router did not make (none when it does not exist)."""
    try:
        names = [entry.name for entry in run_dir.iterdir()]
    except FileNotFoundError:
        return []
    return sorted(name for name in names if not RUN_FILES.match(name))


def prepare_run_dir(run_dir: Path) -> int:
    """Make the run directory, 0700, and lock it (the lock file's descriptor); refuse one
    that holds files of others, or that another running router has locked."""
    foreign = foreign_files(run_dir)
    if foreign:
        shown = ", ".join(foreign[:5])
        raise ValueError(f"--run-dir {run_dir} holds files the router did not make: {shown}")
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(run_dir, 0o700)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ValueError(f"another podnet router runs with --run-dir {run_dir}") from None
    return fd


class RouterProcess:
    """The router's parts, started and stopped in order (module docstring)."""

    def __init__(self, options: RouterOptions) -> None:
        self.options = options
        split_address(options.metrics_address)  # a bad address fails before anything runs
        certificate = options.default_certificate or options.run_dir / DEFAULT_CERTIFICATE
        if options.default_certificate is not None:
            load_default_certificate(options.default_certificate)
        ports = (options.bind, options.http_port, options.https_port)
        self.settings = HAProxySettings(
            options.run_dir, certificate, *ports, reload_interval=options.reload_interval
        )
        self.driver: HAProxyRouter | None = None
        self.api: RemoteApi | None = None
        self.informers: Informers | None = None
        self.statuses: RouteStatusWriter | None = None
        self.metrics_server: MetricsServer | None = None
        self.controller: RouterController | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.failure: Exception | None = None  # what stopped the router, if not a signal
        self._lock: int | None = None

    async def start(self) -> None:
        """Start HAProxy, the controller and the metrics listener."""
        options = self.options
        self._lock = prepare_run_dir(options.run_dir)
        if options.default_certificate is None:
            ensure_default_certificate(self.settings.default_certificate, f"{options.name}.router")
        self.driver = HAProxyRouter(self.settings)  # started by the controller's first pass
        try:  # what no route can fix (the default certificate, say) fails here, not later
            await self.driver.check(RouterTable())
        except ConfigRejected as exc:
            raise ValueError(f"HAProxy refuses the router's base configuration: {exc}") from exc
        self.api = RemoteApi(options.client, agent="podnet-router")
        self.informers = Informers(self.api)
        self.statuses = RouteStatusWriter(self.api, options.name)
        driver = self.driver
        metrics = RouterMetrics(
            lambda: route_counts(driver),
            lambda: ReloadFigures(driver.counters.reloads, driver.counters.last_reload_seconds),
        )
        self.controller = RouterController(
            self.informers, driver, self.statuses, metrics, options.name, options.resync_period
        )
        self.statuses.start()
        for name, run in self.controller.tasks():
            self._tasks.append(asyncio.create_task(self._or_stop(run(), name), name=name))
        server = MetricsServer(metrics.reconcile, options.metrics_address, metrics.refresh)
        await server.start()
        self.metrics_server = server
        log.info(
            "router %s: HTTP on %s:%d, HTTPS on %s:%d (HAProxy starts once Routes, Services"
            " and EndpointSlices have listed), metrics on %s:%d, run dir %s",
            options.name, options.bind, options.http_port, options.bind, options.https_port,
            server.host, server.port, options.run_dir,
        )  # fmt: skip

    async def stop(self) -> None:
        """Stop everything started, HAProxy by PID, and remove the run directory."""
        await cancel_all(self._tasks)
        self._tasks = []
        if self.statuses is not None:
            await self.statuses.stop()
        if self.informers is not None:
            await self.informers.close()
        if self.api is not None:
            await self.api.close()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self.driver is not None:
            await self.driver.stop()
        if self._lock is not None:  # only a router that held the run dir removes it
            if not foreign_files(self.options.run_dir):
                shutil.rmtree(self.options.run_dir, ignore_errors=True)
            os.close(self._lock)
            self._lock = None
        log.info("router %s stopped", self.options.name)
        if self.failure is not None:
            raise self.failure  # the exit status says the router failed

    async def _or_stop(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run one of the router's tasks; if it fails, log it, keep the error and SIGTERM
        this process (whose handler stops it cleanly, then ``stop`` raises the error)."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            trace = not isinstance(exc, ClientError)  # an API refusal needs no traceback
            log.error("router task %s failed; the router stops: %s", name, exc, exc_info=trace)
            self.failure = self.failure or exc
            os.kill(os.getpid(), signal.SIGTERM)


async def route_counts(driver: HAProxyRouter) -> dict[RouteKey, RouteCounts]:
    """Requests and errors per route, from the driver's per-backend totals."""
    found: dict[RouteKey, RouteCounts] = {}
    for stats in (await driver.backend_stats()).values():
        namespace, _, name = stats.route.partition(":")
        seen = found.get((namespace, name), RouteCounts())
        found[(namespace, name)] = RouteCounts(
            seen.requests + stats.requests, seen.errors + stats.errors
        )
    return found
