"""Master CPU per request: a node authenticated by its client certificate (mTLS) against
the same node authenticated by a bearer token, in one run (issue 20's goal: ≤ 1.1).

Run: .venv/bin/python bench/bench_auth.py [--runs 5] [--requests 2000] [--concurrency 8]

A private etcd and a real `podnet master` child process on loopback. A host gets its
node certificate as a joining node does (a bootstrap token, a CertificateSigningRequest
the master approves and signs: ``podnet.client.bootstrap``); the same node also gets a
bearer token. Each round sends ``--requests`` GETs of the node's own Node object over
``--concurrency`` kept-alive connections, once per identity, the order alternating; the
master's CPU time (utime + stime from /proc) is read around each. Also, for information:
one new TLS connection per request (the handshake's cost, where the client certificate's
verification shows).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import ssl
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from podnet.api.auth import ensure_node_token
from podnet.api.pki import Pki
from podnet.client.bootstrap import bootstrap_node
from podnet.kubeconfig import ClientConfig
from podnet.store.etcd_process import start_etcd
from podnet.testing.api import bootstrap_token, kubeconfig_parts
from podnet.testing.processes import MasterProcess

NODE = "bench-n1"
GOAL = 1.1


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cert_context(ca: bytes, kubeconfig: Path, scratch: Path) -> ssl.SSLContext:
    user = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
    cert, key = scratch / "client.crt", scratch / "client.key"
    cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
    key.write_bytes(base64.b64decode(user["client-key-data"]))
    os.chmod(key, 0o600)
    context = ssl.create_default_context(cadata=ca.decode())
    context.load_cert_chain(cert, key)
    return context


def token_context(ca: bytes) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca.decode())


async def load(
    server: str, context: ssl.SSLContext, headers: dict[str, str], requests: int, width: int
) -> None:
    """``requests`` GETs of the node's own Node over ``width`` kept-alive connections."""
    connector = aiohttp.TCPConnector(ssl=context, limit=width)
    async with aiohttp.ClientSession(server, connector=connector, headers=headers) as session:
        left = requests

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with session.get(f"/api/v1/nodes/{NODE}") as answer:
                    await answer.read()
                    if answer.status != 200:
                        raise RuntimeError(f"{answer.status}: {await answer.text()}")

        await asyncio.gather(*(worker() for _ in range(width)))


async def fresh_connections(
    server: str, context: ssl.SSLContext, headers: dict[str, str], requests: int
) -> None:
    """One new TLS connection per request."""
    for _ in range(requests):
        connector = aiohttp.TCPConnector(ssl=context, force_close=True)
        async with (
            aiohttp.ClientSession(server, connector=connector, headers=headers) as session,
            session.get(f"/api/v1/nodes/{NODE}") as answer,
        ):
            await answer.read()


def measure(pid: int, run: Any) -> float:
    before = cpu_seconds(pid)
    asyncio.run(run)
    return cpu_seconds(pid) - before


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="podnet-bench-auth-") as scratch_dir:
        scratch = Path(scratch_dir)
        etcd = start_etcd(scratch / "etcd")
        prefix = f"/bench-auth-{uuid.uuid4().hex[:6]}/"
        master = MasterProcess(etcd.endpoint, scratch / "master", prefix).start(timeout=120)
        try:
            run(args, master, scratch)
        finally:
            master.stop()
            etcd.stop()


def run(args: argparse.Namespace, master: MasterProcess, scratch: Path) -> None:
    assert master.process is not None
    pid = master.process.pid
    ca = Pki.at(master.state_dir / "pki").ca_pem()
    tokens = master.state_dir / "tokens.csv"
    bootstrap = bootstrap_token(master.state_dir)
    node_kubeconfig = scratch / "node.kubeconfig"
    asyncio.run(
        bootstrap_node(
            ClientConfig(master.server, ca, bootstrap),
            NODE,
            scratch / "node.key",
            node_kubeconfig,
            timeout=60,
        )
    )
    bearer = {"Authorization": f"Bearer {ensure_node_token(tokens, NODE)}"}
    mtls = client_cert_context(ca, node_kubeconfig, scratch)
    plain = token_context(ca)
    server, _, admin = kubeconfig_parts(master.kubeconfig)
    asyncio.run(make_node(server, plain, admin))
    for context, headers in ((mtls, {}), (plain, bearer)):  # warm both paths
        asyncio.run(load(server, context, headers, 200, args.concurrency))
    per_request: dict[str, list[float]] = {"mtls": [], "bearer": []}
    handshake: dict[str, list[float]] = {"mtls": [], "bearer": []}
    for i in range(args.runs):
        order = [("mtls", mtls, {}), ("bearer", plain, bearer)]
        if i % 2:
            order.reverse()
        for name, context, headers in order:
            spent = measure(pid, load(server, context, headers, args.requests, args.concurrency))
            per_request[name].append(spent / args.requests * 1e6)
        for name, context, headers in order:
            spent = measure(pid, fresh_connections(server, context, headers, args.handshakes))
            handshake[name].append(spent / args.handshakes * 1e6)
    show(args, per_request, handshake)


async def make_node(server: str, context: ssl.SSLContext, admin: str) -> None:
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
    headers = {"Authorization": f"Bearer {admin}"}
    connector = aiohttp.TCPConnector(ssl=context)
    async with (
        aiohttp.ClientSession(server, connector=connector, headers=headers) as session,
        session.post("/api/v1/nodes", json=body) as answer,
    ):
        if answer.status not in (200, 201, 409):
            raise RuntimeError(f"node: {answer.status} {await answer.text()}")


def show(
    args: argparse.Namespace, per_request: dict[str, list[float]], handshake: dict[str, list[float]]
) -> None:
    m, b = statistics.median(per_request["mtls"]), statistics.median(per_request["bearer"])
    print(f"== master CPU per request, {args.requests} GETs x {args.runs} runs, kept-alive")
    print(f"  node by client certificate (mTLS)   {m:8.1f} µs")
    print(f"  node by bearer token                {b:8.1f} µs")
    print(f"  ratio mTLS/bearer: {m / b:.2f}  (goal: ≤ {GOAL})")
    hm, hb = statistics.median(handshake["mtls"]), statistics.median(handshake["bearer"])
    print(f"== with a new TLS connection per request ({args.handshakes} each; information)")
    print(f"  mTLS {hm:8.1f} µs   bearer {hb:8.1f} µs   ratio {hm / hb:.2f}")
    print(
        f"  (runs, mTLS: {[round(x) for x in per_request['mtls']]}, "
        f"bearer: {[round(x) for x in per_request['bearer']]})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--handshakes", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    started = time.monotonic()
    main(parser.parse_args())
    print(f"({time.monotonic() - started:.0f} s)")
