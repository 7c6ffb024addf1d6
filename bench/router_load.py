"""The load of ``bench_router_reloads``: run on the external host, it sends requests of
four kinds, each from its own threads, and counts every answer that is not a 200 (and
every error) as a failure.

    ip netns exec <ext> python bench/router_load.py --http H --edge H --passthrough H \
        --min-requests 20000 [--threads 2]

Kinds: ``keepalive`` (HTTP/1.1, one connection reused; a response that says
``Connection: close`` ends it and the next request opens another, as clients do; a
reused connection closed before any answer is retried once, as RFC 9112 allows for a
GET and browsers and curl do, and counted as a retry, not a failure),
``new`` (HTTP, a new connection per request), ``edge`` (TLS to the router, a new
connection per request) and ``passthrough`` (TLS through to the pod, likewise). TLS
certificates are not verified (the router's default one and the pods' own CA). Each
host is resolved once (the apps domain's resolver).

It prints ``ready`` once every kind has had one answer, runs until a line arrives on
stdin *and* at least ``--min-requests`` requests are done, then prints one JSON object:
per kind, the requests, the failures and up to 5 failure samples.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

TIMEOUT = 10.0


@dataclass
class Tally:
    """One kind's requests and failures (shared by its threads)."""

    requests: int = 0
    failures: int = 0
    retries: int = 0  # idempotent requests retried on a closed kept-alive connection
    samples: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def retry(self) -> None:
        with self.lock:
            self.retries += 1

    def count(self, failure: str | None) -> None:
        with self.lock:
            self.requests += 1
            if failure is not None:
                self.failures += 1
                if len(self.samples) < 5:
                    self.samples.append(failure)


def _insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def one_shot(ip: str, host: str, port: int, context: ssl.SSLContext | None) -> str | None:
    """One request on a new connection (TLS with SNI ``host`` when ``context``)."""
    try:
        with socket.create_connection((ip, port), timeout=TIMEOUT) as raw:
            sock = context.wrap_socket(raw, server_hostname=host) if context else raw
            request = f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            sock.sendall(request.encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except (OSError, ssl.SSLError) as exc:
        return f"{type(exc).__name__}: {exc}"
    status = data.split(b"\r\n", 1)[0].decode(errors="replace")
    return None if status.startswith("HTTP/1.1 200") else f"status {status!r}"


# A kept-alive connection the server closes just as a request goes out ends without a
# response; RFC 9112 (9.3.1) lets a client retry an idempotent request then, and
# browsers and curl do, once, on a new connection. Those retries are counted apart.
CLOSED_UNANSWERED = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class KeepAlive:
    """One HTTP/1.1 connection reused until the server says it closes."""

    def __init__(self, ip: str, host: str, tally: Tally) -> None:
        self.ip, self.host, self.tally = ip, host, tally
        self.connection: http.client.HTTPConnection | None = None
        self.used = 0  # requests answered on the current connection
        self.used_before = False  # the last request went out on a reused connection

    def request(self) -> str | None:
        try:
            return self._once()
        except CLOSED_UNANSWERED as exc:
            if not self.used_before:
                return f"{type(exc).__name__}: {exc}"
            self.tally.retry()
        try:
            return self._once()
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}"

    def _once(self) -> str | None:
        if self.connection is None:
            self.connection = http.client.HTTPConnection(self.ip, 80, timeout=TIMEOUT)
            self.used = 0
        self.used_before = self.used > 0
        try:
            self.connection.request("GET", "/", headers={"Host": self.host})
            answer = self.connection.getresponse()
            answer.read()
        except (OSError, http.client.HTTPException):
            self.connection.close()
            self.connection = None
            raise
        self.used += 1
        if answer.will_close:
            self.connection.close()
            self.connection = None
        return None if answer.status == 200 else f"status {answer.status}"


def loop(send: Callable[[], str | None], tally: Tally, stop: threading.Event) -> None:
    while not stop.is_set():
        tally.count(send())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", required=True)
    parser.add_argument("--edge", required=True)
    parser.add_argument("--passthrough", required=True)
    parser.add_argument("--min-requests", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=2, help="per kind")
    args = parser.parse_args()
    ips = {h: socket.gethostbyname(h) for h in (args.http, args.edge, args.passthrough)}
    context = _insecure()
    tallies = {kind: Tally() for kind in ("keepalive", "new", "edge", "passthrough")}
    senders: dict[str, Callable[[], Callable[[], str | None]]] = {
        "keepalive": lambda: KeepAlive(ips[args.http], args.http, tallies["keepalive"]).request,
        "new": lambda: lambda: one_shot(ips[args.http], args.http, 80, None),
        "edge": lambda: lambda: one_shot(ips[args.edge], args.edge, 443, context),
        "passthrough": lambda: (
            lambda: one_shot(ips[args.passthrough], args.passthrough, 443, context)
        ),
    }
    stop = threading.Event()
    threads = [
        threading.Thread(target=loop, args=(make(), tallies[kind], stop), daemon=True)
        for kind, make in senders.items()
        for _ in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    while not all(t.requests for t in tallies.values()):
        time.sleep(0.01)
    print("ready", flush=True)
    sys.stdin.readline()
    while sum(t.requests for t in tallies.values()) < args.min_requests:
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(TIMEOUT + 5)
    out = {
        k: {
            "requests": t.requests,
            "failures": t.failures,
            "retries": t.retries,
            "samples": t.samples,
        }
        for k, t in tallies.items()
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
