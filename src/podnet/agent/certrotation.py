"""The node agent's client-certificate rotation (kubelet's certificate manager), and its
figures for ``/metrics``.

When the agent's kubeconfig authenticates by a client certificate of a node
(CN=system:node:<name>, O=system:nodes), ``CertRotator.run`` waits until the
certificate's rotation point (``podnet.agent.certdeadline``: 70-90 % of its life,
jittered), then, as that node and with the certificate it has:

1. makes a new EC P-256 key (in memory only until step 3);
2. asks for a certificate for its own name through a CertificateSigningRequest
   (``podnet.client.bootstrap.request_certificate``; the master's approver passes a
   node's renewal of its own name, ``podnet.controllers.csrapproval``) and waits for it;
3. checks that the pair loads, then replaces the kubeconfig (or the one file it names
   for both) in one atomic write, 0600 (``podnet.agent.certfiles``);
4. reads the kubeconfig back and hands it to the API client (``AsyncApiClient.reload``):
   new connections present the new certificate, without a restart.

A failure at any step is logged and retried with backoff (``certdeadline.retry_delay``);
nothing is written before the new certificate is in hand, so a kubeconfig is never half
updated. ``/metrics`` gets ``podnet_node_client_certificate_expiration_seconds`` (the
current certificate's notAfter, seconds since the epoch) and
``podnet_node_client_certificate_rotations_total{result}``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from podnet.agent.certdeadline import retry_delay, rotation_deadline, seconds_until
from podnet.agent.certfiles import credential_write, read_document
from podnet.api.identity import NODE_USER_PREFIX, NODES_GROUP
from podnet.api.pki import key_pem
from podnet.client.aio import AsyncApiClient
from podnet.client.bootstrap import BootstrapError, request_certificate
from podnet.client.errors import ClientError, one_line
from podnet.client.tls import ssl_context
from podnet.files import write_atomic
from podnet.kubeconfig import KubeconfigError, load_client_config
from podnet.model.csr import CsrError, subject_of

log = logging.getLogger("podnet.agent.certrotation")

CSR_TIMEOUT = 300.0  # seconds to wait for one request to be signed before asking again
MAX_SLEEP = 60.0  # the wall clock is looked at again this often (it may be set meanwhile)
FAILURES = (ClientError, BootstrapError, KubeconfigError, OSError, ValueError)


def node_of_certificate(cert: x509.Certificate) -> str | None:
    """The node a client certificate is exactly for (CN=system:node:<name>,
    O=system:nodes), or None."""
    try:
        subject = subject_of(cert)
    except CsrError:
        return None
    name = subject.common_name.removeprefix(NODE_USER_PREFIX)
    exact = subject.common_name.startswith(NODE_USER_PREFIX) and name
    return name if exact and subject.organizations == (NODES_GROUP,) else None


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CertRotator(Collector):
    """Rotates the client certificate of ``api``'s kubeconfig before it expires."""

    def __init__(
        self,
        api: AsyncApiClient,
        kubeconfig: Path,
        node: str,
        *,
        csr_timeout: float = CSR_TIMEOUT,
        draw: Callable[[], float] = random.random,
        now: Callable[[], dt.datetime] = _utcnow,
    ) -> None:
        self.api = api
        self.kubeconfig = kubeconfig
        self.node = node
        self.csr_timeout = csr_timeout
        self.draw = draw
        self.now = now
        self.rotations = {"ok": 0, "error": 0}

    @classmethod
    def for_client(cls, api: AsyncApiClient) -> CertRotator | None:
        """A rotator when ``api``'s kubeconfig (a file) holds a node's client
        certificate; None for a token or any other certificate (logged)."""
        config = api.config
        if config.source is None or not config.client_cert_data or not config.client_key_data:
            return None
        node = node_of_certificate(x509.load_pem_x509_certificate(config.client_cert_data))
        if node is None:
            log.warning("the client certificate is not a node's: it is not rotated")
            return None
        return cls(api, config.source, node)

    def certificate(self) -> x509.Certificate:
        """The certificate the client presents now."""
        data = self.api.config.client_cert_data
        if data is None:
            raise KubeconfigError(f"{self.kubeconfig} no longer holds a client certificate")
        return x509.load_pem_x509_certificate(data)

    async def run(self) -> None:
        """Rotate at each certificate's rotation point, for ever."""
        while True:
            cert = self.certificate()
            deadline = rotation_deadline(
                cert.not_valid_before_utc, cert.not_valid_after_utc, self.draw()
            )
            log.info(
                "client certificate %x valid until %s; rotating it at %s",
                cert.serial_number,
                cert.not_valid_after_utc.isoformat(),
                deadline.replace(microsecond=0).isoformat(),
            )
            while (left := seconds_until(deadline, self.now())) > 0:
                await asyncio.sleep(min(left, MAX_SLEEP))
            await self.rotate_until_done(cert)

    async def rotate_until_done(self, cert: x509.Certificate) -> x509.Certificate:
        """``rotate`` until it succeeds, waiting ``retry_delay`` between tries."""
        attempt = 0
        while True:
            try:
                return await self.rotate()
            except FAILURES as exc:
                self.rotations["error"] += 1
                left = (cert.not_valid_after_utc - self.now()).total_seconds()
                delay = retry_delay(attempt, left, self.draw())
                expired = " (it has expired: the node must join again)" if left <= 0 else ""
                log.error(
                    "rotating the client certificate of node %s failed: %s; certificate "
                    "%x valid until %s%s; retrying in %.1fs",
                    self.node,
                    one_line(exc),
                    cert.serial_number,
                    cert.not_valid_after_utc.isoformat(),
                    expired,
                    delay,
                )
                await asyncio.sleep(delay)
                attempt += 1

    async def rotate(self) -> x509.Certificate:
        """One rotation (steps 1-4 of the module docstring); the new certificate."""
        old = self.certificate()
        key = ec.generate_private_key(ec.SECP256R1())
        cert_pem = await request_certificate(self.api, self.node, key, self.csr_timeout)
        new_key = key_pem(key)
        ssl_context(replace(self.api.config, client_cert_data=cert_pem, client_key_data=new_key))
        write = credential_write(self.kubeconfig, read_document(self.kubeconfig), cert_pem, new_key)
        await asyncio.to_thread(write_atomic, write.path, write.data, 0o600)
        config = await asyncio.to_thread(load_client_config, str(self.kubeconfig))
        if config.client_cert_data != cert_pem:
            raise KubeconfigError(f"{self.kubeconfig} does not read back the new certificate")
        self.api.reload(config)
        new = x509.load_pem_x509_certificate(cert_pem)
        self.rotations["ok"] += 1
        log.info(
            "client certificate of node %s rotated: %x -> %x, valid until %s; %s written",
            self.node,
            old.serial_number,
            new.serial_number,
            new.not_valid_after_utc.isoformat(),
            write.note,
        )
        return new

    def collect(self) -> Iterator[Metric]:
        """The current certificate's expiry and the rotations so far."""
        try:
            expiry = self.certificate().not_valid_after_utc.timestamp()
        except (KubeconfigError, ValueError):
            expiry = 0.0
        yield GaugeMetricFamily(
            "podnet_node_client_certificate_expiration_seconds",
            "When the agent's client certificate expires, in seconds since the epoch",
            value=expiry,
        )
        counter = CounterMetricFamily(
            "podnet_node_client_certificate_rotations",
            "Client certificate rotations by result (error: a try that failed and is retried)",
            labels=["result"],
        )
        for result, count in sorted(self.rotations.items()):
            counter.add_metric([result], count)
        yield counter


def start_rotation(
    api: AsyncApiClient, register: Callable[[Collector], None]
) -> asyncio.Task[None] | None:
    """Rotate ``api``'s client certificate in the background (in the running loop), its
    figures given to ``register``; None when its kubeconfig holds no node certificate."""
    rotator = CertRotator.for_client(api)
    if rotator is None:
        return None
    register(rotator)
    task = asyncio.create_task(rotator.run(), name="client-certificate-rotation")
    task.add_done_callback(_stopped)
    return task


def _stopped(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("client certificate rotation stopped: %s", task.exception())
