"""Leader election, so that only one master runs the controllers at a time.

``EtcdLeaderElector`` holds a key bound to an etcd lease: it is created with a
put-if-absent transaction, kept alive every ttl/4, and vanishes with the lease when the
holder dies. The holder declares itself no longer leader (``lost`` is set) *before* the
lease can expire: when renewals keep failing up to the lease's deadline, when etcd
reports the lease gone, or when the key no longer carries this holder's value. The master
renews in a thread with its own event loop and etcd connection (``OffLoop``): an event
loop busy with thousands of API requests delays the controllers, but must not cost the
lease. ``AlwaysLeader`` is for a single master on the in-memory store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from aetcd import rpc

from podnet.client.backoff import Backoff
from podnet.store.base import StoreUnavailable
from podnet.store.etcd import EtcdStore

log = logging.getLogger("podnet.controllers.leader")

DEFAULT_LEADER_KEY = "/podnet/leader/controllers"
T = TypeVar("T")


async def _within(work: Awaitable[T], timeout: float) -> T:
    """``work`` with a deadline (asyncio.timeout: 3.11's wait_for can swallow a cancel)."""
    async with asyncio.timeout(timeout):
        return await work


def holder_identity(value: bytes) -> str:
    """Who holds leadership, from the leader key's value (JSON ``holder``, else the text)."""
    try:
        return str(json.loads(value)["holder"])
    except (ValueError, KeyError, TypeError):
        return value.decode(errors="replace")


class LeaderElector(Protocol):
    """What the controller manager needs from an election."""

    identity: str
    lost: asyncio.Event

    async def acquire(self) -> None:
        """Block until this process leads; ``lost`` is cleared for the new term."""

    async def release(self) -> None:
        """Stop leading (idempotent)."""


class AlwaysLeader:
    """The only master there is: leads at once and never loses."""

    def __init__(self, identity: str = "podnet-master") -> None:
        self.identity = identity
        self.lost = asyncio.Event()

    async def acquire(self) -> None:
        """Lead at once, with a fresh ``lost`` event."""
        self.lost = asyncio.Event()

    async def release(self) -> None:
        """Nothing to give up."""
        return None


class EtcdLeaderElector:
    """Leadership as an etcd key bound to this process's lease."""

    def __init__(
        self,
        store: EtcdStore,
        key: str,
        identity: str,
        ttl: int = 10,
        renewal_store: Callable[[], EtcdStore] | None = None,
    ) -> None:
        if ttl < 2:
            raise ValueError("the lease ttl must be at least 2 seconds")
        self.store = store
        self.key = key
        self.identity = identity
        self.ttl = ttl
        self.lost = asyncio.Event()
        # Given: renewals run in a thread of their own, on their own etcd connection, so a
        # busy event loop (thousands of API requests) cannot starve them past the ttl.
        self.renewal_store = renewal_store
        self._lease_id: int | None = None
        self._value = b""
        self._deadline = 0.0
        self._keepalive: asyncio.Task[None] | OffLoop | None = None

    @property
    def is_leader(self) -> bool:
        """Whether this process holds the key now (as far as it knows)."""
        return self._lease_id is not None and not self.lost.is_set()

    async def holder(self) -> str | None:
        """The identity of the current leader, if any."""
        kv = await self.store.get(self.key)
        return None if kv is None else holder_identity(kv.value)

    async def acquire(self) -> None:
        """Block until this process holds the key; then keep its lease alive."""
        await self.release()
        self.lost = asyncio.Event()
        attempt = 0
        while True:
            try:
                if await self._campaign_once():
                    break
                attempt = 0
            except StoreUnavailable as exc:
                delay = Backoff(0.2, 5.0).delay(attempt)
                log.warning("leader election on %s: %s; retrying in %.1fs", self.key, exc, delay)
                await asyncio.sleep(delay)
                attempt += 1
        self._keepalive = self._start_keepalive()
        log.info("%s is now the leader (%s, lease %x)", self.identity, self.key, self._lease_id)

    async def release(self) -> None:
        """Stop renewing and revoke the lease, which deletes the key at once."""
        if isinstance(self._keepalive, OffLoop):
            await self._keepalive.stop()
        elif self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
        self._keepalive = None
        lease_id, self._lease_id = self._lease_id, None
        if lease_id is None:
            return
        try:
            await _within(self.store.client.revoke_lease(lease_id), self.ttl / 2)
            log.info("%s released leadership of %s", self.identity, self.key)
        except Exception as exc:  # the lease then just expires
            log.warning("could not revoke lease %x (%s); it expires by itself", lease_id, exc)

    # ---- campaign -----------------------------------------------------------------------

    async def _campaign_once(self) -> bool:
        """Try to take the key; on failure wait until it is free (or a ttl passes)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        lease_id = await self._grant()
        value = json.dumps({"holder": self.identity, "lease": lease_id}).encode()
        if await self._put_if_absent(lease_id, value):
            self._lease_id, self._value = lease_id, value
            self._deadline = started + self.ttl
            return True
        await self._revoke_quietly(lease_id)
        await self._wait_vacant()
        return False

    async def _grant(self) -> int:
        try:
            lease = await _within(self.store.client.lease(self.ttl), self.ttl)
        except Exception as exc:
            raise StoreUnavailable(f"cannot grant a lease: {exc}") from exc
        return int(lease.id)

    async def _put_if_absent(self, lease_id: int, value: bytes) -> bool:
        key = self.key.encode()
        request = rpc.TxnRequest(
            compare=[
                rpc.Compare(
                    key=key,
                    target=rpc.Compare.CREATE,
                    result=rpc.Compare.EQUAL,
                    create_revision=0,
                )
            ],
            success=[
                rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease_id))
            ],
            failure=[],
        )
        response = await self._rpc(self.store.client.kvstub.Txn, request)
        return bool(response.succeeded)

    async def _rpc(self, method: Any, request: Any) -> Any:
        client = self.store.client
        try:
            return await method(request, timeout=self.ttl / 2, metadata=client.metadata)
        except Exception as exc:
            raise StoreUnavailable(f"etcd request failed: {exc}") from exc

    async def _revoke_quietly(self, lease_id: int) -> None:
        with contextlib.suppress(Exception):
            await _within(self.store.client.revoke_lease(lease_id), self.ttl / 2)

    async def _wait_vacant(self) -> None:
        kv = await self.store.get(self.key)
        if kv is None:
            return
        holder = await self.holder()
        log.info("%s waits for leadership: %s holds %s", self.identity, holder, self.key)
        stream = self.store.watch(self.key, kv.mod_revision)
        try:
            async with asyncio.timeout(self.ttl):
                async for event in stream:
                    if event.key == self.key and event.type == "DELETE":
                        return
        except TimeoutError:
            return
        finally:
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()

    # ---- keepalive ----------------------------------------------------------------------

    def _start_keepalive(self) -> asyncio.Task[None] | OffLoop:
        if self.renewal_store is None:
            return asyncio.create_task(self._keep_alive(self.store), name="leader-keepalive")
        make_store, main = self.renewal_store, asyncio.get_running_loop()

        def lose(why: str) -> None:
            main.call_soon_threadsafe(self._lose, why)

        async def renew_off_loop() -> None:
            store = make_store()
            try:
                await store.connect()
                await self._keep_alive(store, lose)
            except Exception as exc:  # no renewals: say so before the lease lapses
                lose(f"renewals stopped: {type(exc).__name__}: {exc}")
            finally:
                with contextlib.suppress(Exception):
                    await store.close()

        return OffLoop(renew_off_loop, "leader-keepalive")

    async def _keep_alive(
        self, store: EtcdStore, lose: Callable[[str], object] | None = None
    ) -> None:
        """Renew at once, then every ttl/4; after a failure retry every ttl/10, each try
        bounded by the time left, and give up only when a try fails at the lease's
        deadline: a busy master or etcd costs a retry, not the leadership.

        A renewal that succeeds even after the estimated deadline (taken from before the
        grant, so early) proves the lease never lapsed: nobody else can hold the key.
        """
        loop = asyncio.get_running_loop()
        interval, retry = self.ttl / 4, self.ttl / 10
        margin = min(1.0, interval / 2)
        wait = 0.0  # at once: the lease was granted before a campaign that may have been slow
        while True:
            await asyncio.sleep(wait)
            left = self._deadline - margin - loop.time()
            problem = await self._renew(store, loop.time(), max(min(self.ttl / 3, left), retry))
            if problem is None:
                wait = interval
                continue
            if problem.startswith("!") or loop.time() + retry >= self._deadline - margin:
                (lose or self._lose)(problem.lstrip("!"))
                return
            log.warning("leader %s: lease renewal failed (%s); retrying", self.identity, problem)
            wait = retry

    async def _renew(self, store: EtcdStore, sent: float, timeout: float) -> str | None:
        """Renew the lease and check the key within ``timeout`` seconds; None if fine, else
        why (``!``: lost for sure)."""
        assert self._lease_id is not None
        try:
            async with asyncio.timeout(timeout):
                reply = await store.client.refresh_lease(self._lease_id)
                if reply is None or reply.TTL <= 0:
                    return "!the lease expired"
                self._deadline = sent + int(reply.TTL)
                kv = await store.get(self.key)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        if kv is None or kv.value != self._value:
            return "!the leader key no longer names this holder"
        return None

    def _lose(self, why: str) -> None:
        # The lease is revoked by the next release() (or acquire()), best effort.
        log.error("%s lost leadership of %s: %s", self.identity, self.key, why)
        self.lost.set()


class OffLoop:
    """A coroutine run in a thread with its own event loop, so the main loop's load does
    not delay it; ``stop`` cancels it and waits for the thread."""

    def __init__(self, work: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self._work = work
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._started.wait()

    def _main(self) -> None:
        async def run() -> None:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            self._started.set()
            await self._work()

        try:
            asyncio.run(run())
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("%s failed", self._thread.name)
        finally:
            self._started.set()

    async def stop(self) -> None:
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # its loop has ended already
                loop.call_soon_threadsafe(task.cancel)
        await asyncio.to_thread(self._thread.join)
