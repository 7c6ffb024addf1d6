"""The API relay fails over between masters: a dead first target is skipped, and the
relay sticks to the target that answered last (loopback only)."""

from __future__ import annotations

import asyncio

import pytest

from podnet.cluster.relay import Targets, connection_handler, main, relay
from podnet.store.etcd_process import free_port


async def _server(tag: bytes) -> tuple[asyncio.base_events.Server, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.write(tag)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _ask(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"?")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(16), 5)
    writer.close()
    return data


async def test_relay_skips_a_dead_master_and_sticks_to_the_live_one() -> None:
    dead = free_port()  # nothing listens: connections are refused
    first, first_port = await _server(b"one")
    second, second_port = await _server(b"two")
    relay = await asyncio.start_server(
        connection_handler([dead, first_port, second_port]), "127.0.0.1", 0
    )
    port = relay.sockets[0].getsockname()[1]
    try:
        assert await _ask(port) == b"one"
        first.close()
        await first.wait_closed()
        assert await _ask(port) == b"two"  # the first live master died: next one
        assert await _ask(port) == b"two"
    finally:
        relay.close()
        second.close()


async def test_relay_closes_the_client_when_no_master_answers() -> None:
    relay = await asyncio.start_server(
        connection_handler([free_port(), free_port()]), "127.0.0.1", 0
    )
    port = relay.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"?")  # a client speaks first (TLS, HTTP): then a master is sought
        assert await asyncio.wait_for(reader.read(16), 10) == b""
        writer.close()
    finally:
        relay.close()


def test_targets_rotate_from_the_last_that_worked() -> None:
    targets = Targets([("127.0.0.1", 1), ("127.0.0.1", 2), ("127.0.0.1", 3)])
    targets.worked(("127.0.0.1", 2))
    assert [p for _, p in targets.order()] == [2, 3, 1]


def test_the_root_namespace_relay_listens_on_loopback_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Network safety: an address other than 127.0.0.1 needs --netns (a project
    namespace); asked for in the root namespace, the relay refuses before it listens."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--port", str(free_port()), "--host", "192.168.100.241"])
    assert exit_info.value.code == 2
    assert "--host other than 127.0.0.1 needs --netns" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"127\.0\.0\.1 only"):
        asyncio.run(relay(None, free_port(), [free_port()], "0.0.0.0"))
