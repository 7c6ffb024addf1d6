"""``podnet controllers``: the master's controllers as their own process, over HTTPS.

The process reaches the API only through ``RemoteApi`` (the asyncio HTTPS client with a
bearer token); leadership is the Lease ``kube-system/podnet-controllers``
(``podnet.controllers.leaselock``), so it needs no etcd access at all. Run the masters
with ``--no-controllers`` then: their own controllers would elect through etcd, a
different lock. With ``metrics_address`` (``--metrics-address HOST:PORT``) it serves
``/metrics`` there (``podnet.controllers.processmetrics``; off by default).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from podnet.agent.metrics import MetricsServer, split_address
from podnet.controllers.config import NetworkConfig
from podnet.controllers.leaselock import DEFAULT_DURATION, ApiLeaseElector
from podnet.controllers.manager import ControllerManager, run_or_stop_process
from podnet.controllers.processmetrics import ControllersMetrics
from podnet.controllers.remote import RemoteApi
from podnet.controllers.supervisor import Supervisor
from podnet.controllers.workqueue import cancel_all
from podnet.kubeconfig import ClientConfig

log = logging.getLogger("podnet.controllers.process")


@dataclass
class ControllersOptions:
    network: NetworkConfig
    server: str  # https://host:port of the API
    token_file: Path
    ca_file: Path | None = None  # the API's CA (PEM); None: the system's trust store
    leader_elect: bool = True
    lease_seconds: int = DEFAULT_DURATION
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    metrics_address: str | None = None  # HOST:PORT of /metrics; None: not served

    def client_config(self) -> ClientConfig:
        token = self.token_file.read_text().strip()
        if not token:
            raise ValueError(f"the token file {self.token_file} is empty")
        ca = self.ca_file.read_bytes() if self.ca_file else None
        return ClientConfig(server=self.server, ca_data=ca, token=token)


class ControllersProcess:
    """The controller manager over HTTPS, under API leader election."""

    def __init__(self, options: ControllersOptions) -> None:
        self.options = options
        address = options.metrics_address
        if address is not None:
            split_address(address)  # a bad address fails before anything runs
        self.api = RemoteApi(options.client_config(), agent="podnet-controllers")
        elector = None
        if options.leader_elect:
            elector = ApiLeaseElector(self.api, options.identity, options.lease_seconds)
        self.metrics = ControllersMetrics(lambda: self.manager.ready)
        supervisor = Supervisor(on_failure=self.metrics.failed)
        self.manager = ControllerManager(self.api, options.network, elector, supervisor=supervisor)
        self.metrics_server = MetricsServer(self.metrics, address) if address else None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        log.info("running the controllers against %s", self.options.server)
        if self.metrics_server is not None:
            await self.metrics_server.start()
        run = run_or_stop_process(self.manager, "podnet controllers")
        self._tasks.append(asyncio.create_task(run, name="controllers"))

    async def stop(self) -> None:
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        await self.manager.stop()
        await cancel_all(self._tasks)
        await self.api.close()
