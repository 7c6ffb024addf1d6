"""A small HTTP and HTTPS server for test pods: each answer names the pod and echoes the
request, so a client behind the router sees which pod served it and what arrived.

``python -m podnet.cluster.httpecho --name web-1 [--port 8080]... [--tls-port 8443
(--cert FILE --key FILE | --self-signed NAME,...)]`` answers every GET, HEAD or POST
with ``200`` and a JSON body::

    {"pod": "web-1", "method": "GET", "path": "/a", "tls": false,
     "headers": {"host": "www.apps.podnet.test", "x-forwarded-for": "192.168.100.250", ...}}

HTTP/1.1 keep-alive is served (every answer has a Content-Length), with TCP_NODELAY.
The certificate and key files are read once at start. With ``--self-signed`` the server
makes its own CA and a certificate for the names (the first is its CN), keeps the key in
memory only (a memfd), and prints the CA certificate, so a re-encrypt route can name it
as its destination CA. Connections idle for ``IDLE_TIMEOUT`` seconds are closed, request
bodies are read up to ``MAX_BODY`` bytes, and SIGTERM/SIGINT end it. It only answers: it
never starts traffic.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import sys
import tempfile
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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
        # TCP_NODELAY, as real servers set it: the body goes out after the headers at
        # once, not when the client's delayed ACK (40 ms) of the headers arrives
        disable_nagle_algorithm = True
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


def self_signed_context(names: Sequence[str]) -> tuple[ssl.SSLContext, str]:
    """A server context with a new certificate for ``names`` from a new CA (the
    certificate's key never touches a file system); and the CA certificate in PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    from podnet.api.pki import issue_leaf, key_pem, load_or_create_ca

    with tempfile.TemporaryDirectory() as scratch:  # the CA's key lives for this call only
        where = Path(scratch)
        ca_cert, ca_key = load_or_create_ca(where / "ca.crt", where / "ca.key", "httpecho-ca")
    sans: set[x509.IPAddress | x509.DNSName] = {x509.DNSName(name) for name in names}
    cert, key = issue_leaf(ca_cert, ca_key, names[0], sans, [ExtendedKeyUsageOID.SERVER_AUTH])
    pem = serialization.Encoding.PEM
    chain = cert.public_bytes(pem) + ca_cert.public_bytes(pem)
    files = []
    for content in (chain, key_pem(key)):
        fd = os.memfd_create("httpecho-tls", os.MFD_CLOEXEC)
        os.write(fd, content)
        files.append(fd)
    try:
        context = tls_context(*(f"/proc/self/fd/{fd}" for fd in files))
    finally:
        for fd in files:
            os.close(fd)
    return context, ca_cert.public_bytes(pem).decode()


class Server(ThreadingHTTPServer):
    """A thread per connection; a listen backlog a proxy's bursts of new connections fit
    in (socketserver's default, 5, drops SYNs and costs a 1 s retransmission)."""

    daemon_threads = True
    request_queue_size = 256


def make_servers(
    pod: str, ports: Sequence[int], tls_ports: Sequence[int], context: ssl.SSLContext | None
) -> list[Server]:
    """One listening server per port (plain ``ports``, TLS ``tls_ports``), not yet serving."""
    servers = []
    for port in dict.fromkeys(ports):
        servers.append(Server(("0.0.0.0", port), handler_class(pod, False)))
    for port in dict.fromkeys(tls_ports):
        server = Server(("0.0.0.0", port), handler_class(pod, True))
        assert context is not None
        # The handshake happens in the connection's own thread, at its first read
        # (bounded by the handler's timeout), not in the accepting thread.
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
        servers.append(server)
    return servers


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m podnet.cluster.httpecho")
    parser.add_argument("--name", required=True, help="the pod name put in every answer")
    parser.add_argument("--port", type=int, action="append", default=[])
    parser.add_argument("--tls-port", type=int, action="append", default=[])
    parser.add_argument("--cert", help="PEM certificate (and chain) for --tls-port")
    parser.add_argument("--key", help="PEM key for --tls-port")
    parser.add_argument("--self-signed", metavar="NAME,...", help="make a CA and a cert")
    args = parser.parse_args(argv)
    if args.tls_port and not (args.cert and args.key) and not args.self_signed:
        parser.error("--tls-port needs --cert and --key, or --self-signed")
    if not args.port and not args.tls_port:
        args.port = [8080]
    context = None
    if args.tls_port and args.self_signed:
        context, ca_pem = self_signed_context(args.self_signed.split(","))
        print(f"httpecho {args.name}: CA certificate\n{ca_pem}", end="", flush=True)
    elif args.tls_port:
        context = tls_context(args.cert, args.key)
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
