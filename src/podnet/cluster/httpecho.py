"""A small HTTP and HTTPS server for test pods: each answer names the pod and echoes the
request, so a client behind the router sees which pod served it and what arrived.

``python -m podnet.cluster.httpecho --name web-1 [--port 8080]... [--tls-port 8443
--cert FILE --key FILE]`` answers every GET, HEAD or POST with ``200`` and a JSON body::

    {"pod": "web-1", "method": "GET", "path": "/a", "tls": false,
     "headers": {"host": "www.apps.podnet.test", "x-forwarded-for": "192.168.100.250", ...}}

HTTP/1.1 keep-alive is served (every answer has a Content-Length). The certificate and
key files are read once at start. Connections idle for ``IDLE_TIMEOUT`` seconds are
closed, request bodies are read up to ``MAX_BODY`` bytes, and SIGTERM/SIGINT end it. It
only answers: it never starts traffic.
"""

from __future__ import annotations

import argparse
import json
import signal
import ssl
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

IDLE_TIMEOUT = 30.0
MAX_BODY = 65536


def answer_body(pod: str, method: str, path: str, tls: bool, headers: dict[str, str]) -> bytes:
    """The JSON answer for one request (header names lower-cased)."""
    shown = {name.lower(): value for name, value in headers.items()}
    doc = {"pod": pod, "method": method, "path": path, "tls": tls, "headers": shown}
    return json.dumps(doc, sort_keys=True).encode() + b"\n"


def handler_class(pod: str, tls: bool) -> type[BaseHTTPRequestHandler]:
    """A request handler answering as ``pod`` (over TLS when ``tls``)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = IDLE_TIMEOUT
        server_version = "podnet-httpecho"

        def _answer(self, send_body: bool) -> None:
            length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY)
            if length:
                self.rfile.read(length)
            body = answer_body(pod, self.command, self.path, tls, dict(self.headers.items()))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer(True)

        def do_POST(self) -> None:
            self._answer(True)

        def do_HEAD(self) -> None:
            self._answer(False)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per request would flood the pod log under load

    return Handler


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context with the certificate (and chain) in ``cert`` and its ``key``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def make_servers(
    pod: str, ports: Sequence[int], tls_ports: Sequence[int], context: ssl.SSLContext | None
) -> list[ThreadingHTTPServer]:
    """One listening server per port (plain ``ports``, TLS ``tls_ports``), not yet serving."""
    servers = []
    for port in dict.fromkeys(ports):
        servers.append(ThreadingHTTPServer(("0.0.0.0", port), handler_class(pod, False)))
    for port in dict.fromkeys(tls_ports):
        server = ThreadingHTTPServer(("0.0.0.0", port), handler_class(pod, True))
        assert context is not None
        # The handshake happens in the connection's own thread, at its first read
        # (bounded by the handler's timeout), not in the accepting thread.
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
        servers.append(server)
    for server in servers:
        server.daemon_threads = True
    return servers


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m podnet.cluster.httpecho")
    parser.add_argument("--name", required=True, help="the pod name put in every answer")
    parser.add_argument("--port", type=int, action="append", default=[])
    parser.add_argument("--tls-port", type=int, action="append", default=[])
    parser.add_argument("--cert", help="PEM certificate (and chain) for --tls-port")
    parser.add_argument("--key", help="PEM key for --tls-port")
    args = parser.parse_args(argv)
    if args.tls_port and not (args.cert and args.key):
        parser.error("--tls-port needs --cert and --key")
    if not args.port and not args.tls_port:
        args.port = [8080]
    context = tls_context(args.cert, args.key) if args.tls_port else None
    servers = make_servers(args.name, args.port, args.tls_port, context)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    ports = ", ".join(str(s.server_address[1]) for s in servers)
    print(f"httpecho {args.name}: serving on {ports}", flush=True)
    stop = threading.Event()

    def _stop(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    stop.wait()
    for server in servers:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
