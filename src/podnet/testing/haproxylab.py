"""A lab for the router's HAProxy layer: a test CA, tiny HTTP/HTTPS backends and a load
generator, all inside one project-made network namespace.

``lab`` (a context manager) creates the namespace with a per-run unique name, starts
backends in it and removes everything (backends by PID, the namespace by exact name) when
it ends, also when the test fails. ``LoopThread`` runs an event loop in a thread that has
entered the namespace, so a process it forks (HAProxy) starts there.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from podnet import netns
from podnet.router.haproxy import DriverCounters, HAProxyRouter, HAProxySettings
from podnet.router.table import RouteBackend, RouterTable, Server
from podnet.testing.lab import unique_run
from podnet.testing.processes import stop_process

T = TypeVar("T")
BACKEND = "podnet.testing.haproxybackend"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


@dataclass(frozen=True)
class LabCA:
    """A certificate authority for one test run."""

    name: str
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate

    @classmethod
    def create(cls, name: str) -> LabCA:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(name, key, cert)

    @property
    def pem(self) -> str:
        return self.certificate.public_bytes(serialization.Encoding.PEM).decode()

    def issue(self, *names: str) -> str:
        """A leaf certificate for ``names`` (the first is its CN), with its key: one PEM."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(names[0]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM).decode() + _key_pem(key)


class LoopThread:
    """An event loop on a thread inside namespace ``ns``: what it forks (HAProxy) starts
    in the namespace. ``call`` runs a coroutine there and returns its result."""

    def __init__(self, ns: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(ns,), name=f"loop-{ns}")
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None:
            raise self._error

    def _main(self, ns: str) -> None:
        try:
            with netns.entered(ns):
                asyncio.set_event_loop(self.loop)
                self.loop.call_soon(self._ready.set)
                self.loop.run_forever()
        except BaseException as error:
            self._error = error
            self._ready.set()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


@dataclass
class BackgroundLoad:
    """A load generator running until ``finish`` (see ``Lab.start_load``)."""

    process: subprocess.Popen[str]
    stop_file: Path

    def finish(self) -> dict[str, int]:
        """Stop the load; the answers counted by status."""
        self.stop_file.touch()
        out, err = self.process.communicate(timeout=120)
        assert self.process.returncode == 0, err
        result: dict[str, int] = json.loads(out.splitlines()[-1])
        return result


@dataclass
class Lab:
    """One namespace with backends in it; ``close`` removes all of it."""

    ns: str
    work: Path
    backends: list[subprocess.Popen[bytes]] = field(default_factory=list)
    loads: list[subprocess.Popen[str]] = field(default_factory=list)

    def backend(self, ip: str, port: int, tag: str, tls_pem: str | None = None) -> None:
        """Start a backend answering with ``tag`` (and the request's headers, as JSON) on
        ``ip:port``, over TLS with ``tls_pem`` if given; return once it listens."""
        argv = [sys.executable, "-m", BACKEND, ip, str(port), tag]
        if tls_pem:
            pem = self.work / f"backend-{tag}-{port}.pem"
            pem.write_text(tls_pem)
            argv.append(str(pem))
        process = subprocess.Popen(
            netns.command(self.ns, argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        self.backends.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()  # the backend prints "ready" once it listens
        if line.strip() != b"ready":
            raise RuntimeError(f"backend {tag} on {ip}:{port} did not start")

    def run(self, *argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the namespace."""
        return netns.run(self.ns, argv, timeout=timeout)

    def load(
        self, scheme: str, port: int, host: str, requests: int, workers: int, keep_alive: bool
    ) -> dict[str, int]:
        """Send ``requests`` GETs for ``host`` (SNI and Host) to 127.0.0.1:``port`` from
        ``workers`` threads in the namespace; the answers counted by status (``error``:
        a request that got none)."""
        mode = "keep-alive" if keep_alive else "close"
        argv = ["--load", scheme, "127.0.0.1", str(port), host, "/", str(requests)]
        done = self.run(sys.executable, "-m", BACKEND, *argv, str(workers), mode, timeout=300)
        assert done.returncode == 0, done.stderr
        result: dict[str, int] = json.loads(done.stdout)
        return result

    def start_load(
        self, scheme: str, port: int, host: str, workers: int, keep_alive: bool
    ) -> BackgroundLoad:
        """Like ``load``, but running until ``finish``; returns once it has an answer."""
        stop = self.work / f"stop-{uuid.uuid4().hex[:8]}"
        mode = "keep-alive" if keep_alive else "close"
        argv = ["--load", scheme, "127.0.0.1", str(port), host, "/", "0", str(workers), mode]
        command = netns.command(self.ns, [sys.executable, "-m", BACKEND, *argv, str(stop)])
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.loads.append(process)
        load = BackgroundLoad(process, stop)
        assert process.stdout is not None
        if process.stdout.readline().strip() != "running":
            load.finish()
            raise RuntimeError("the load generator got no answer")
        return load

    def close(self) -> None:
        for load in self.loads:  # left running by a failed test
            if load.poll() is None:
                load.kill()
                load.wait(timeout=30)
        for process in self.backends:
            stop_process(process)
        netns.remove(self.ns)


@contextmanager
def lab(tag: str) -> Iterator[Lab]:
    """A namespace (loopback up) named after ``tag`` and this run; removed afterwards."""
    name = unique_run(tag)
    work = Path(tempfile.mkdtemp(prefix="hx-"))  # short: unix socket paths live here
    the_lab = Lab(name, work)
    try:
        netns.create(name)
        yield the_lab
    finally:
        the_lab.close()
        subprocess.run(["rm", "-rf", "--", str(work)], check=False, timeout=60)


@contextmanager
def running_router(
    the_lab: Lab, table: RouterTable, **overrides: Any
) -> Iterator[tuple[LoopThread, HAProxyRouter]]:
    """HAProxy for ``table`` on 127.0.0.1:80/443 in the lab's namespace, with a default
    certificate of its own (CN ``router-default``); stopped afterwards, also on failure."""
    default = the_lab.work / "default.pem"
    if not default.exists():
        default.write_text(LabCA.create("default-ca").issue("router-default"))
    settings = HAProxySettings(
        run_dir=the_lab.work / "run",
        default_certificate=default,
        bind_address="127.0.0.1",
        **overrides,
    )
    loop = LoopThread(the_lab.ns)
    router = HAProxyRouter(settings)
    try:
        loop.call(router.start(table))
        yield loop, router
    finally:
        try:
            loop.call(router.stop(grace=5.0))
        finally:
            loop.close()


def apply(loop: LoopThread, router: HAProxyRouter, table: RouterTable) -> DriverCounters:
    """Update the router with ``table`` and wait until it is applied (or refused)."""

    async def update() -> DriverCounters:
        return await router.settled(router.update(table))

    return loop.call(update())


def web_and_edge(
    ca: LabCA, web: tuple[Server, ...], edge: tuple[Server, ...]
) -> tuple[RouteBackend, RouteBackend]:
    """The labs' two usual routes in ``ns1``: plain HTTP ``web.example.com`` and edge TLS
    ``edge.example.com`` with a certificate from ``ca``."""
    return (
        RouteBackend("ns1", "web", "web.example.com", servers=web),
        RouteBackend(
            "ns1",
            "edge",
            "edge.example.com",
            termination="edge",
            certificate_pem=ca.issue("edge.example.com"),
            servers=edge,
        ),
    )


def broken_edge(*servers: Server) -> RouteBackend:
    """``ns1/broken``: an edge route whose certificate is PEM armour around no
    certificate, which the API would refuse and HAProxy does (``ns1:broken.pem``)."""
    return RouteBackend(
        "ns1",
        "broken",
        "broken.example.com",
        termination="edge",
        certificate_pem="-----BEGIN CERTIFICATE-----\nbm9wZQ==\n-----END CERTIFICATE-----\n",
        servers=servers,
    )
