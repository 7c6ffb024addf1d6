"""``StoreHealth``: a failed probe cuts the calls waiting on etcd and fails new ones at
once; the first answer brings etcd back (``podnet.store.health``)."""

from __future__ import annotations

import asyncio

import pytest

from podnet.store.base import StoreUnavailable
from podnet.store.health import StoreHealth


class FakeEtcd:
    """A probe target that answers, or hangs like a frozen etcd."""

    def __init__(self) -> None:
        self.frozen = False

    async def probe(self, timeout: float) -> None:
        if self.frozen:  # as gRPC's deadline does
            await asyncio.sleep(timeout)
            raise TimeoutError("deadline exceeded")


async def test_an_outage_cuts_a_waiting_call_and_fails_new_ones_until_etcd_answers() -> None:
    etcd = FakeEtcd()
    health = StoreHealth(etcd.probe, timeout=0.05, interval=0.01)
    health.start()
    try:

        async def call() -> str:
            async with health.guarded():
                await asyncio.sleep(3600)  # a call waiting on a frozen etcd
            return "answered"

        waiting = asyncio.create_task(call())
        await asyncio.sleep(0.05)
        etcd.frozen = True
        with pytest.raises(StoreUnavailable, match="failing fast"):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(StoreUnavailable):
            async with health.guarded():
                pass
        assert health.outages == 1
        etcd.frozen = False
        for _ in range(500):  # up to 5 s for the probe to find it back
            if not health.down:
                break
            await asyncio.sleep(0.01)
        async with health.guarded():
            pass  # answered again
    finally:
        await health.stop()


async def test_a_timeout_of_the_call_itself_is_not_an_outage() -> None:
    health = StoreHealth(FakeEtcd().probe, timeout=0.05, interval=0.01)
    health.start()
    try:
        with pytest.raises(TimeoutError):
            async with health.guarded():
                async with asyncio.timeout(0.01):
                    await asyncio.sleep(1)
        assert not health.down
    finally:
        await health.stop()
