"""``ReadBatcher``: gets of one loop turn go out together, in batches of at most the
limit; each caller gets its own answer or its batch's error; a get asked after a batch
left is never answered by it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from podnet.store.readbatch import ReadBatcher


class Backend:
    """Answers each key with its text and the number of the send it came in."""

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def send(self, keys: Sequence[bytes]) -> list[str]:
        self.sent.append(list(keys))
        number = len(self.sent)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [f"{key.decode()}@{number}" for key in keys]


async def test_gets_of_one_turn_share_one_send_in_batches_of_the_limit() -> None:
    backend = Backend()
    batcher = ReadBatcher(backend.send, limit=4)
    answers = await asyncio.gather(*(batcher.read(b"k%d" % i) for i in range(10)))
    assert [len(keys) for keys in backend.sent] == [4, 4, 2]
    assert answers == [f"k{i}@{i // 4 + 1}" for i in range(10)]
    assert batcher.batches == 3


async def test_a_get_asked_while_a_batch_is_out_waits_for_the_next_one() -> None:
    backend = Backend()
    backend.gate = asyncio.Event()
    batcher = ReadBatcher(backend.send)
    early = asyncio.create_task(batcher.read(b"a"))
    while not backend.sent:
        await asyncio.sleep(0)
    late = asyncio.create_task(batcher.read(b"a"))
    await asyncio.sleep(0)
    backend.gate.set()
    assert await early == "a@1"
    assert await late == "a@2"  # sent after it was asked
    assert backend.sent == [[b"a"], [b"a"]]


async def test_a_failed_send_fails_each_of_its_callers_only() -> None:
    backend = Backend()
    backend.fail = ConnectionError("etcd went away")
    batcher = ReadBatcher(backend.send)
    failed = await asyncio.gather(batcher.read(b"a"), batcher.read(b"b"), return_exceptions=True)
    assert all(isinstance(f, ConnectionError) for f in failed)
    backend.fail = None
    assert await batcher.read(b"c") == "c@2"


async def test_a_caller_that_gives_up_does_not_spoil_the_others() -> None:
    backend = Backend()
    backend.gate = asyncio.Event()
    batcher = ReadBatcher(backend.send)
    quitter = asyncio.create_task(batcher.read(b"a"))
    stayer = asyncio.create_task(batcher.read(b"b"))
    while not backend.sent:
        await asyncio.sleep(0)
    quitter.cancel()
    backend.gate.set()
    assert await stayer == "b@1"
    with pytest.raises(asyncio.CancelledError):
        await quitter
