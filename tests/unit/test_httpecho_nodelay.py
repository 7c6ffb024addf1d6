"""httpecho sends its answers with TCP_NODELAY, as real servers do: with Nagle's algorithm
the body, written after the headers, waited for the client's delayed ACK of them (40 ms),
which capped a kept-alive connection at about 22 answers a second, through the router
and directly alike (issue 19, finding 13's benchmark)."""

from __future__ import annotations

import http.client
import socket
import threading
from typing import Any

from podnet.cluster import httpecho


class Recording(httpecho.Server):
    """httpecho's server, noting each served connection's TCP_NODELAY when it is done."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), httpecho.handler_class("web-1", False))
        self.nodelay: list[int] = []
        self.done = threading.Event()

    def finish_request(self, request: Any, client_address: Any) -> None:
        super().finish_request(request, client_address)
        self.nodelay.append(request.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        self.done.set()


def test_answers_go_out_without_nagle() -> None:
    server = Recording()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
        for _ in range(3):  # one kept-alive connection
            connection.request("GET", "/")
            assert connection.getresponse().read()
        connection.close()
        assert server.done.wait(10)
    finally:
        server.shutdown()
        server.server_close()
    assert server.nodelay == [1]
