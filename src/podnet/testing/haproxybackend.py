"""Run inside a lab namespace (``python -m podnet.testing.haproxybackend``), either as

- a backend: ``IP PORT TAG [PEM]`` answers every GET with JSON ``{"tag", "path",
  "headers"}`` over HTTP/1.1 (keep-alive), over TLS with PEM (certificate and key) if
  given (``GET /hold/<file>`` first marks ``<file>.started`` and waits for ``<file>``);
  prints ``ready`` once it listens and exits after ``LIFETIME`` seconds at most;
- a load generator: ``--load SCHEME IP PORT HOST PATH REQUESTS WORKERS keep-alive|close
  [STOPFILE]`` sends GETs for HOST+PATH (SNI and Host) and prints the answers counted by
  status as JSON (``error``: no status, e.g. a reset connection). With REQUESTS 0 it runs
  until STOPFILE exists (at most ``LIFETIME``), printing ``running`` after its first
  answer.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LIFETIME = 600.0  # a backend never outlives a test run by much, even if orphaned
TIMEOUT = 10.0
HOLD = 30.0  # the longest a /hold/ request is kept in flight


def hold(release: str) -> None:
    """Keep a request in flight: mark ``<release>.started``, then wait (at most
    ``HOLD``) until the file ``release`` exists."""
    Path(release + ".started").touch()
    deadline = time.monotonic() + HOLD
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)


def serve(ip: str, port: int, tag: str, pem: str | None) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path.startswith("/hold/"):
                hold(self.path.removeprefix("/hold"))
            body = json.dumps(
                {"tag": tag, "path": self.path, "headers": dict(self.headers.items())}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((ip, port), Handler)
    server.daemon_threads = True
    if pem:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pem)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Timer(LIFETIME, server.shutdown).start()
    print("ready", flush=True)
    server.serve_forever()


class _TLSConnection(http.client.HTTPConnection):
    """HTTPS to an address with another name as SNI; the certificate is not checked (the
    tests look at it with openssl s_client)."""

    def __init__(self, ip: str, port: int, sni: str) -> None:
        super().__init__(ip, port, timeout=TIMEOUT)
        self._sni = sni
        self._context = ssl.create_default_context()
        self._context.check_hostname = False
        self._context.verify_mode = ssl.CERT_NONE

    def connect(self) -> None:
        super().connect()
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._sni)


def _connection(scheme: str, ip: str, port: int, host: str) -> http.client.HTTPConnection:
    if scheme == "https":
        return _TLSConnection(ip, port, host)
    return http.client.HTTPConnection(ip, port, timeout=TIMEOUT)


def load(argv: list[str]) -> dict[str, int]:
    scheme, ip, port, host, path, requests, workers, mode, *stop = argv
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    remaining = [int(requests)]
    deadline = time.monotonic() + LIFETIME

    def take() -> bool:
        if stop:
            return not os.path.exists(stop[0]) and time.monotonic() < deadline
        with lock:
            remaining[0] -= 1
            return remaining[0] >= 0

    def worker() -> None:
        conn = None
        while take():
            try:
                conn = conn or _connection(scheme, ip, int(port), host)
                conn.request("GET", path, headers={"Host": host})
                response = conn.getresponse()
                response.read()
                status = str(response.status)
                if mode == "close" or response.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                status = "error"
                if conn is not None:
                    conn.close()
                conn = None
            with lock:
                if stop and not counts.total():
                    print("running", flush=True)
                counts[status] += 1
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(int(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return dict(counts)


def main(argv: list[str]) -> None:
    if argv[0] == "--load":
        print(json.dumps(load(argv[1:])))
        return
    serve(argv[0], int(argv[1]), argv[2], argv[3] if len(argv) > 3 else None)


if __name__ == "__main__":
    main(sys.argv[1:])
