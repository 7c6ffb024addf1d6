"""Leader election through a Lease object, over the in-process object API (in memory)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from podnet.api.registry import Registry
from podnet.client.errors import ServerError, Unreachable
from podnet.controllers.inprocess import InProcessApi
from podnet.controllers.leaselock import LEASE_NAME, LEASE_NAMESPACE, ApiLeaseElector
from podnet.model.kinds import LEASE, Kind
from podnet.testing.e2e import eventually

Obj = dict[str, Any]
BOUND = 10.0  # seconds: every wait below ends far sooner, or the test fails


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def until(check: Callable[[], bool]) -> None:
    await eventually(check, BOUND)


async def lease(registry: Registry) -> Obj:
    return await registry.get(LEASE, LEASE_NAMESPACE, LEASE_NAME)


async def test_a_candidate_waits_for_the_holder_and_takes_over_on_release(
    registry: Registry, api: InProcessApi
) -> None:
    first = ApiLeaseElector(api, "first", duration=2)
    second = ApiLeaseElector(api, "second", duration=2, clock=Clock())  # its time stands
    await first.acquire()
    waiting = asyncio.create_task(second.acquire())
    try:
        await until(lambda: second._observed is not None)  # it has read the Lease
        seen = second._observed
        await until(lambda: second._observed != seen)  # and read a renewal since
        assert not waiting.done()
        assert (await lease(registry))["spec"]["holderIdentity"] == "first"
        await first.release()
        await asyncio.wait_for(waiting, BOUND)
        spec = (await lease(registry))["spec"]
        assert spec["holderIdentity"] == "second" and spec["leaseTransitions"] == 1
        assert not first.lost.is_set() and not second.lost.is_set()
    finally:
        waiting.cancel()
        await second.release()


async def test_a_dead_holders_lease_is_taken_once_it_is_a_duration_old(
    registry: Registry, api: InProcessApi
) -> None:
    crashed = ApiLeaseElector(api, "crashed", duration=2)
    await crashed.acquire()
    for task in crashed._keepalive:  # the process "dies": no renewals, no release
        task.cancel()
    clock = Clock()
    spy = Spy(api)
    heir = ApiLeaseElector(spy, "heir", duration=2, clock=clock)
    taking = asyncio.create_task(heir.acquire())
    try:
        await until(lambda: spy.gets >= 2)  # it has looked twice: not expired yet
        assert not taking.done()
        clock.now += 2  # a whole duration without a change of the record
        await asyncio.wait_for(taking, BOUND)
        assert (await lease(registry))["spec"]["holderIdentity"] == "heir"
    finally:
        taking.cancel()
        await heir.release()


async def test_a_holder_whose_lease_names_another_knows_it_lost(
    registry: Registry, api: InProcessApi
) -> None:
    holder = ApiLeaseElector(api, "holder", duration=2)
    await holder.acquire()
    try:
        current = await lease(registry)
        current["spec"]["holderIdentity"] = "intruder"
        await registry.update(LEASE, current, LEASE_NAMESPACE, LEASE_NAME)
        await asyncio.wait_for(holder.lost.wait(), BOUND)
    finally:
        await holder.release()
    # release leaves another holder's Lease alone
    assert (await lease(registry))["spec"]["holderIdentity"] == "intruder"


async def test_a_holder_that_cannot_renew_stops_before_the_lease_could_expire(
    api: InProcessApi,
) -> None:
    clock = Clock()
    spy = Spy(api)
    holder = ApiLeaseElector(spy, "holder", duration=3, clock=clock)
    await holder.acquire()
    try:
        spy.refuse_updates = True
        await until(lambda: spy.refused >= 2)
        assert not holder.lost.is_set()  # a failed renewal or two: still leading
        clock.now += holder.renew_deadline  # renewals keep failing for the deadline
        await asyncio.wait_for(holder.lost.wait(), BOUND)
        assert holder.renew_deadline < holder.duration
    finally:
        spy.refuse_updates = False
        await holder.release()


async def test_a_candidate_keeps_campaigning_while_the_api_is_unreachable(
    registry: Registry, api: InProcessApi
) -> None:
    spy = Spy(api)
    spy.unreachable = True
    candidate = ApiLeaseElector(spy, "candidate", duration=2)
    campaign = asyncio.create_task(candidate.acquire())
    try:
        await until(lambda: spy.gets >= 3)  # tried and tried again, never gave up
        assert not campaign.done()
        spy.unreachable = False
        await asyncio.wait_for(campaign, BOUND)
        assert (await lease(registry))["spec"]["holderIdentity"] == "candidate"
    finally:
        campaign.cancel()
        await candidate.release()


async def test_a_holder_whose_renewal_hangs_steps_down_in_time(api: InProcessApi) -> None:
    clock = Clock()
    spy = Spy(api)
    holder = ApiLeaseElector(spy, "holder", duration=3, clock=clock)
    await holder.acquire()
    try:
        spy.hang = True  # every read from now on never answers
        campaign_reads = spy.gets
        await until(lambda: spy.gets > campaign_reads)  # a renewal is stuck in its read
        assert not holder.lost.is_set()
        clock.now += holder.renew_deadline
        await asyncio.wait_for(holder.lost.wait(), BOUND)
    finally:
        spy.hang = False
        await holder.release()


class Spy:
    """The API, counting reads; reads unreachable or hanging, updates refused on demand."""

    def __init__(self, api: InProcessApi) -> None:
        self._api = api
        self.gets = 0
        self.refused = 0
        self.refuse_updates = False
        self.unreachable = False
        self.hang = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    async def get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        self.gets += 1
        if self.unreachable:
            raise Unreachable("https://master", "connection refused")
        if self.hang:
            await asyncio.Event().wait()
        return await self._api.get(kind, namespace, name)

    async def update(self, kind: Kind, obj: Obj) -> Obj:
        if self.refuse_updates:
            self.refused += 1
            raise ServerError("etcd is busy", 503, "ServiceUnavailable")
        return await self._api.update(kind, obj)
