"""``podnet master``: etcd store + API server + controllers, in one process.

Start order: connect to etcd, make the PKI and the admin credentials, serve the API (so
clients and `/readyz` work at once), then run the controllers under leader election.
The controllers reach the objects through the in-process object API: the registry for
writes and the API server's watch cache for watches, so they add no etcd watch.
`/readyz` answers 200 while the API serves and etcd answers, once the cluster is set up:
this master's controllers went through their first sync, or another master leads. A
standby is ready, as in Kubernetes (a load balancer keeps it); leadership is
``/leaderz`` (200 on the leader only) and the ``podnet_master_leader`` gauge of
``/metrics``. With
``run_controllers=False`` (``podnet master --no-controllers``) the master only serves the
API, and ``podnet controllers`` runs them as their own process over HTTPS.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Gauge

from podnet.api.audit import AuditLog, AuditOptions
from podnet.api.auth import (
    ensure_controllers_token,
    ensure_node_token,
    ensure_router_token,
    node_user,
)
from podnet.api.certrevocation import RevokedCertificates
from podnet.api.clusterinfo import ClusterInfo
from podnet.api.controlplanecerts import ControlPlaneCerts
from podnet.api.identity import ROUTER_USER_PREFIX, controllers_user
from podnet.api.kubernetesservice import MasterServiceReconciler
from podnet.api.limits import RequestLimits
from podnet.api.masterleases import EtcdMasterLeases
from podnet.api.masterservice import SERVICE_NAMES
from podnet.api.metrics import ApiMetrics
from podnet.api.pki import CLIENT_VALIDITY, Pki, ensure_pki, load_ca
from podnet.api.registry import DEFAULT_PREFIX, Registry
from podnet.api.routehosts import DEFAULT_ROUTE_SUFFIX
from podnet.api.server import ApiServer
from podnet.api.servicealloc import ServiceRanges, kubernetes_service_ip
from podnet.api.serviceallocator import ServiceAllocator
from podnet.api.tokenauth import TokenAuthenticator
from podnet.api.tokenissue import IMPORTED_SUFFIX, ensure_admin, import_token_file
from podnet.api.tokenstore import StoreSettings
from podnet.controllers.config import NetworkConfig
from podnet.controllers.csrsigner import CsrSigner
from podnet.controllers.inprocess import InProcessApi
from podnet.controllers.leader import EtcdLeaderElector, holder_identity
from podnet.controllers.manager import ControllerManager, run_or_stop_process
from podnet.controllers.supervisor import Supervisor
from podnet.daemonmetrics import add_daemon_metrics
from podnet.files import write_atomic
from podnet.heap import HeapGovernor
from podnet.kubeconfig import load_client_config, write_kubeconfig
from podnet.listener import ConnectionLimits
from podnet.store.base import StoreUnavailable
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_pki import EtcdTls
from podnet.store.etcdmetrics import EtcdMetrics

log = logging.getLogger("podnet.master")


@dataclass
class MasterOptions:
    network: NetworkConfig
    etcd: str = "127.0.0.1:2379"  # one or more host:port, comma-separated
    etcd_tls: EtcdTls | None = None  # CA, client cert and key for a TLS etcd
    kubeconfig_server: str = ""  # the admin kubeconfig's server (default: this master)
    etcd_prefix: str = DEFAULT_PREFIX
    listen_host: str = "127.0.0.1"
    listen_port: int = 6443
    state_dir: Path = Path("/var/lib/podnet/master")
    extra_hosts: list[str] = field(default_factory=list)
    compact_interval: float = 300.0
    leader_elect: bool = True
    run_controllers: bool = True  # False: serve the API only (controllers run elsewhere)
    services: ServiceRanges | None = None  # node ports, external IPs (default: kube's)
    route_suffix: str = DEFAULT_ROUTE_SUFFIX  # hosts of Routes without one: <name>-<ns>.<suffix>
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    # Where nodes (and pods, through default/kubernetes) reach this master; none: the
    # kubernetes Service has no endpoints from this master. Port 0: listen_port.
    advertise_address: str = ""
    advertise_port: int = 0
    master_service_interval: float = 10.0
    # (freeze every, thaw every) seconds for ``podnet.heap``; None: CPython's collector
    # as it is (a master inside another process, such as a test's, leaves it alone)
    heap: tuple[float, float] | None = None
    # what one identity may hold at once, and one source's connections (issue 19)
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    connection_limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    audit: AuditOptions = field(default_factory=AuditOptions)  # podnet.api.audit
    # the life of the client certificates the CSR signer issues (--cluster-signing-duration)
    cluster_signing_duration: dt.timedelta = CLIENT_VALIDITY

    @property
    def tokens_path(self) -> Path:
        return self.state_dir / "tokens.csv"

    @property
    def kubeconfig_path(self) -> Path:
        return self.state_dir / "admin.kubeconfig"

    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"


class Master:
    """One master process: serves the API and runs the controllers."""

    def __init__(self, options: MasterOptions) -> None:
        self.options = options
        self.metrics = ApiMetrics()
        add_daemon_metrics(self.metrics.registry)  # process_*, podnet_build_info
        # fail_fast: during an etcd outage the API answers 503 at once (podnet.store.health)
        etcd_metrics = EtcdMetrics(self.metrics.registry)
        self.store = EtcdStore(
            options.etcd, tls=options.etcd_tls, fail_fast=True, metrics=etcd_metrics
        )
        services = options.services or ServiceRanges(options.network.service_network)
        self.registry_ranges = services
        suffix = options.route_suffix
        self.registry = Registry(
            self.store, prefix=options.etcd_prefix, services=services, route_suffix=suffix
        )
        self.controllers: ControllerManager | None = None
        self.server: ApiServer | None = None
        self.master_service: MasterServiceReconciler | None = None
        self.csr_signer: CsrSigner | None = None
        self.heap: HeapGovernor | None = None
        self.audit: AuditLog | None = None
        self.tokens = TokenAuthenticator(self.store, options.etcd_prefix)
        self.revocations = RevokedCertificates(self.store, options.etcd_prefix)
        self._tasks: list[asyncio.Task[None]] = []
        self._set_up = not options.run_controllers  # the cluster is set up (see _readiness)
        leader = Gauge(
            "podnet_master_leader",
            "1 while this master leads (holds the election, its controllers synced), else 0",
            registry=self.metrics.registry,
        )
        leader.set_function(lambda: float(self.leading))

    @property
    def leading(self) -> bool:
        """Whether this master leads, its controllers through their first sync."""
        return self.controllers is not None and self.controllers.ready

    @property
    def leader_key(self) -> str:
        return f"{self.options.etcd_prefix}leader"

    async def _readiness(self) -> str | None:
        """Why ``/readyz`` is 503 besides etcd, or None. Until the cluster is set up (this
        master's controllers synced, or another master holds the election: a standby),
        and never after: a change of leader leaves every serving master ready."""
        if self._set_up or self.leading:
            self._set_up = True
            return None
        if self.options.leader_elect:
            kv = await self.store.get(self.leader_key)
            holder = None if kv is None else holder_identity(kv.value)
            if holder is not None and holder != self.options.identity:
                self._set_up = True
                return None
        return "controllers starting"

    async def start(self) -> None:
        opts = self.options
        opts.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        await self.store.connect()
        pki = ensure_pki(opts.pki_dir, self._certificate_hosts())
        await self._start_tokens()
        await self.revocations.start()  # a removed node's certificates, on every master
        admin_token = await ensure_admin(
            self.store, opts.etcd_prefix, self._kubeconfig_token(), opts.identity
        )
        self.audit = AuditLog.from_options(opts.audit, opts.state_dir)
        self.server = ApiServer(
            self.registry,
            self.tokens,
            self.metrics,
            self._readiness,
            opts.request_limits,
            opts.connection_limits,
            leading=lambda: self.leading,
            audit=self.audit,
            cluster_info=ClusterInfo(pki.ca_pem(), self.registry),
            control_plane_certs=ControlPlaneCerts(self.store, opts.etcd_prefix),
            revoked=self.revocations.revoked,
        )
        await self.server.start(opts.listen_host, opts.listen_port, pki.server_ssl_context())
        server = opts.kubeconfig_server or self.server.address
        write_kubeconfig(opts.kubeconfig_path, server, pki.ca_pem(), admin_token)
        log.info("admin kubeconfig written to %s", opts.kubeconfig_path)
        self._start_master_service(self.server)
        if opts.run_controllers:
            self._start_controllers(self.server)
        # The CA's key is here: approve and sign node client certificates (TLS bootstrap).
        self.csr_signer = CsrSigner(
            self.registry,
            load_ca(pki),
            cache=self.server.cache,
            duration=opts.cluster_signing_duration,
        )
        self.csr_signer.start()
        self._tasks.append(asyncio.create_task(self._compact_forever(), name="compactor"))
        if opts.heap is not None:
            self.heap = HeapGovernor(self.metrics.registry, *opts.heap)
            self.heap.start()

    async def _start_tokens(self) -> None:
        """Tell the credential commands where the tokens live (``etcd.json``), import a
        legacy ``tokens.csv`` once, then authenticate from etcd (``podnet.api.tokenauth``)."""
        opts = self.options
        StoreSettings(self.store_endpoints, opts.etcd_prefix, opts.etcd_tls).save(opts.state_dir)
        imported = await import_token_file(self.store, opts.etcd_prefix, opts.tokens_path)
        if imported is not None:
            log.info(
                "imported %d new tokens of %s into etcd; the file is no longer read (renamed %s%s)",
                imported,
                opts.tokens_path,
                opts.tokens_path.name,
                IMPORTED_SUFFIX,
            )
        await self.tokens.start()
        log.info("authenticating bearer tokens from etcd (%sidentities/tokens/)", opts.etcd_prefix)

    @property
    def store_endpoints(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.store.endpoints)

    def _kubeconfig_token(self) -> str | None:
        """The token of the admin kubeconfig this state dir holds, if any (kept while its
        record in etcd still says admin: a restart does not pile up admin tokens)."""
        path = self.options.kubeconfig_path
        if not path.is_file():
            return None
        try:
            return load_client_config(str(path)).token or None
        except Exception:
            return None

    def _certificate_hosts(self) -> list[str]:
        """The serving certificate's names: the listen and advertised addresses, the
        extra hosts, and the kubernetes Service's cluster IP and DNS names."""
        opts = self.options
        service_ip = kubernetes_service_ip(opts.network.service_network)
        hosts = [opts.listen_host, opts.advertise_address, *opts.extra_hosts, service_ip]
        return list(dict.fromkeys(h for h in [*hosts, *SERVICE_NAMES] if h))

    def _start_master_service(self, server: ApiServer) -> None:
        """Keep default/kubernetes, with this master in its endpoints while it runs."""
        opts = self.options
        allocator = ServiceAllocator(self.registry, self.registry_ranges)
        self.master_service = MasterServiceReconciler(
            InProcessApi(self.registry, server.cache),
            allocator.service_network,
            opts.advertise_port or opts.listen_port,
            EtcdMasterLeases(self.store, opts.etcd_prefix),
            opts.advertise_address or None,
            opts.master_service_interval,
        )
        self.master_service.start()

    def _start_controllers(self, server: ApiServer) -> None:
        opts = self.options
        elector = None
        if opts.leader_elect:
            elector = EtcdLeaderElector(
                self.store, self.leader_key, opts.identity, renewal_store=self._renewal_store
            )
        api = InProcessApi(self.registry, server.cache, controllers_user(opts.identity))
        failures = self.metrics.controller_errors  # a failed controller, counted by name
        supervisor = Supervisor(on_failure=lambda name: failures.labels(name).inc())
        self.controllers = ControllerManager(api, opts.network, elector, supervisor=supervisor)
        run = run_or_stop_process(self.controllers, "the master")
        self._tasks.append(asyncio.create_task(run, name="controllers"))

    def _renewal_store(self) -> EtcdStore:
        """A second etcd connection, for the leader's renewals in their own thread."""
        return EtcdStore(self.options.etcd, tls=self.options.etcd_tls)

    async def _compact_forever(self) -> None:
        """Compact etcd history older than one interval, as kube-apiserver does."""
        previous = None
        while True:
            await asyncio.sleep(self.options.compact_interval)
            try:
                current = await self.store.revision()
                if previous is not None and previous > 1:
                    await self.store.compact(previous)
                    if self.server:
                        self.server.cache.forget_before(previous)
                    log.info("compacted etcd history up to revision %d", previous)
                previous = current
            except StoreUnavailable as exc:
                log.warning("compaction skipped: %s", exc)
            except Exception as exc:
                if "compacted" not in str(exc):
                    log.warning("compaction failed: %s", exc)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.controllers:
            await self.controllers.stop()
        if self.csr_signer:
            await self.csr_signer.stop()
        if self.master_service:
            await self.master_service.stop()
        if self.server:
            await self.server.stop()
        await self.tokens.stop()
        await self.revocations.stop()
        await self.store.close()
        if self.heap:
            await self.heap.stop()
        if self.audit:
            self.audit.close()


def node_credentials(state_dir: Path, node: str, server: str, out: Path) -> Path:
    """Write a kubeconfig for a node agent, with a token for that node only."""
    token = ensure_node_token(state_dir / "tokens.csv", node)
    pki = Pki.at(state_dir / "pki")
    write_kubeconfig(out, server, pki.ca_pem(), token, user=node_user(node))
    return out


def controllers_credentials(state_dir: Path, name: str, token_file: Path, ca_file: Path) -> None:
    """Write a token for controllers instance ``name`` (group ``system:podnet:controllers``:
    only what the controllers use) and the API's CA, for ``podnet controllers``."""
    token = ensure_controllers_token(state_dir / "tokens.csv", name)
    write_atomic(token_file, token + "\n")
    write_atomic(ca_file, Pki.at(state_dir / "pki").ca_pem(), 0o644)


def router_credentials(
    state_dir: Path,
    name: str,
    *,
    token_file: Path | None = None,
    ca_file: Path | None = None,
    kubeconfig: Path | None = None,
    server: str = "",
) -> None:
    """Issue the token of router ``name`` (user ``system:podnet:router:<name>``, group
    ``system:podnet:routers``: reads Routes, Services, Endpoints and EndpointSlices, writes
    ``routes/status`` only) and write it as a token file and the API's CA, and/or as a
    kubeconfig for ``server`` (0600, like every file holding the token)."""
    token = ensure_router_token(state_dir / "tokens.csv", name)
    ca_pem = Pki.at(state_dir / "pki").ca_pem()
    if token_file is not None:
        write_atomic(token_file, token + "\n")
    if ca_file is not None:
        write_atomic(ca_file, ca_pem, 0o644)
    if kubeconfig is not None:
        write_kubeconfig(kubeconfig, server, ca_pem, token, user=f"{ROUTER_USER_PREFIX}{name}")
