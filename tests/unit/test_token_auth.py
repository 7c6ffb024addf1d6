"""The master's token authenticator (``podnet.api.tokenauth``) and the token writers
(``podnet.api.tokenissue``) on an in-memory store: a token created elsewhere works at
once, a deleted one stops at once with the watch and within the freshness bound without
it, a table that cannot be confirmed is never trusted (fail closed), expired tokens are
refused, and a legacy tokens.csv is imported once."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from podnet.api import tokenauth
from podnet.api.tokenauth import TokenAuthenticator
from podnet.api.tokenissue import (
    create_bootstrap,
    delete_token,
    ensure_admin,
    import_token_file,
    issue,
    list_tokens,
    put_new,
)
from podnet.api.tokenrecords import RecordError, bootstrap_record, digest, token_key
from podnet.model.errors import ApiError
from podnet.store.base import Delete, KeyValue, Put, StoreError, StoreUnavailable, WatchEvent
from podnet.store.memory import MemoryStore

P = "/reg/"


class FlakyStore(MemoryStore):
    """A memory store whose watch, lists and reads can be broken on purpose."""

    def __init__(self) -> None:
        super().__init__()
        self.watch_broken = False
        self.list_fails = False
        self.get_fails = False
        self.gets = 0
        self.get_error: Exception | None = None

    async def watch(self, prefix: str, after_revision: int) -> AsyncIterator[WatchEvent]:
        if self.watch_broken:
            await asyncio.Event().wait()  # silent: a watch that broke without telling
        async for event in super().watch(prefix, after_revision):
            if self.watch_broken:
                await asyncio.Event().wait()
            yield event

    async def list(self, prefix: str) -> tuple[list[KeyValue], int]:
        if self.list_fails:
            raise StoreUnavailable("etcd is away")
        return await super().list(prefix)

    async def get(self, key: str) -> KeyValue | None:
        self.gets += 1
        if self.get_error is not None:
            raise self.get_error
        if self.get_fails:
            raise StoreUnavailable("etcd is away")
        return await super().get(key)


async def started(store: FlakyStore, **kwargs: float) -> TokenAuthenticator:
    auth = TokenAuthenticator(store, P, **kwargs)
    await auth.start()
    return auth


async def _until_refused(auth: TokenAuthenticator, token: str) -> None:
    while await auth.lookup(token) is not None:
        await asyncio.sleep(0.02)


async def refused_after(auth: TokenAuthenticator, token: str, bound: float) -> bool:
    """Whether ``token`` is refused within ``bound`` seconds (a bounded wait, no clock
    in an assertion: TimeoutError otherwise)."""
    try:
        await asyncio.wait_for(_until_refused(auth, token), bound)
    except TimeoutError as exc:
        raise AssertionError(f"still accepted after {bound}s") from exc
    return True


async def test_a_token_made_after_start_works_at_once_and_a_deleted_one_stops() -> None:
    store = FlakyStore()
    auth = await started(store)
    try:
        store.watch_broken = True  # not even the watch: the miss reads the store
        token = await issue(store, P, "system:node:n1", ["system:nodes"])
        user = await auth.authenticate_request(f"Bearer {token}")
        assert user.name == "system:node:n1" and user.node_name == "n1"
        store.watch_broken = False
    finally:
        await auth.stop()
    auth = await started(store)  # with a working watch, deletion is seen at once
    try:
        assert await auth.lookup(token) is not None
        await store.commit([], [Delete(token_key(P, digest(token)))])
        assert await refused_after(auth, token, 1.0)
        with pytest.raises(ApiError) as caught:
            await auth.authenticate_request(f"Bearer {token}")
        assert caught.value.code == 401
    finally:
        await auth.stop()


async def test_without_the_watch_a_relist_confirms_revocation() -> None:
    store = FlakyStore()
    token = await issue(store, P, "admin", ["system:masters"])
    auth = await started(store, relist_seconds=0.2)
    try:
        store.watch_broken = True
        assert await auth.lookup(token) is not None
        await store.commit([], [Delete(token_key(P, digest(token)))])
        assert await refused_after(auth, token, 2.0)
    finally:
        await auth.stop()


async def test_a_table_not_confirmed_is_not_trusted_fail_closed() -> None:
    store = FlakyStore()
    token = await issue(store, P, "admin", ["system:masters"])
    auth = await started(store, relist_seconds=0.1, fresh_seconds=0.3)
    try:
        store.watch_broken = store.list_fails = True
        assert await auth.lookup(token) is not None  # still fresh: from the table
        reads = store.gets
        await asyncio.sleep(0.4)
        assert not auth.fresh
        assert await auth.lookup(token) is not None and store.gets == reads + 1  # read
        await store.commit([], [Delete(token_key(P, digest(token)))])
        assert await auth.lookup(token) is None  # the store's word, not the table's
        store.get_fails = True
        other = await issue(store, P, "admin", ["system:masters"])
        with pytest.raises(StoreUnavailable):  # 503: never a stale grant
            await auth.lookup(other)
        store.get_fails = False
        store.get_error = StoreError("etcdserver: no leader")  # any store error: 503
        with pytest.raises(StoreUnavailable):
            await auth.lookup(other)
    finally:
        await auth.stop()


async def test_expired_and_malformed_records_and_bad_headers_are_401() -> None:
    store = FlakyStore()
    token = "abcdef.0123456789abcdef"
    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=2)
    await put_new(store, P, token, bootstrap_record(token, datetime.timedelta(hours=1), at=old))
    bad = "x" * 43
    await store.commit([], [Put(token_key(P, digest(bad)), b'{"user": "admin"}')])
    auth = await started(store)
    try:
        for header in (f"Bearer {token}", f"Bearer {bad}", None, "Basic x", "Bearer a b"):
            with pytest.raises(ApiError) as caught:
                await auth.authenticate_request(header)
            assert caught.value.code == 401
    finally:
        await auth.stop()


async def test_the_digest_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    store = FlakyStore()
    token = await issue(store, P, "admin", ["system:masters"])
    auth = await started(store)
    calls: list[tuple[bytes, bytes]] = []
    real = tokenauth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(tokenauth.hmac, "compare_digest", spy)
    try:
        assert await auth.lookup(token) is not None
        assert calls == [(bytes.fromhex(digest(token)), bytes.fromhex(digest(token)))]
    finally:
        await auth.stop()


async def test_bootstrap_tokens_are_listed_by_id_and_deleted_by_id_or_digest() -> None:
    store = FlakyStore()
    token = await create_bootstrap(store, P, datetime.timedelta(hours=1), "n1", "join n1")
    node = await issue(store, P, "system:node:n1", ["system:nodes"])
    listed = {t.id: t for t in await list_tokens(store, P)}
    assert token[:6] in listed and digest(node)[:16] in listed
    assert listed[token[:6]].record.node == "n1"
    with pytest.raises(RecordError, match="no token with id"):
        await delete_token(store, P, "zzzzzz")
    with pytest.raises(RecordError, match="bad token id"):
        await delete_token(store, P, "Not-An-Id")
    assert len(await list_tokens(store, P)) == 2  # nothing deleted
    assert (await delete_token(store, P, token[:6])).record.user == f"system:bootstrap:{token[:6]}"
    assert (await delete_token(store, P, digest(node)[:12])).record.user == "system:node:n1"
    assert await list_tokens(store, P) == []


async def test_the_admin_token_is_kept_while_valid_and_replaced_once_revoked() -> None:
    store = FlakyStore()
    first = await ensure_admin(store, P, None, "m1")
    assert await ensure_admin(store, P, first, "m1") == first
    other = await ensure_admin(store, P, None, "m2")
    assert other != first  # each master its own
    await store.commit([], [Delete(token_key(P, digest(first)))])
    assert await ensure_admin(store, P, first, "m1") != first
    node = await issue(store, P, "system:node:n1", ["system:nodes"])
    assert await ensure_admin(store, P, node, "m1") != node  # never promotes another's


async def test_a_legacy_tokens_csv_is_imported_once(tmp_path: Path) -> None:
    store = FlakyStore()
    csv = tmp_path / "tokens.csv"
    csv.write_text("tok-aaaaaaaaaaaaaaaa,admin,u1,system:masters\ntok-bbbbbbbbbbbbbbbb,n,u2\n")
    assert await import_token_file(store, P, csv) == 2
    assert not csv.exists() and (tmp_path / "tokens.csv.imported").exists()
    auth = await started(store)
    try:
        record = await auth.lookup("tok-aaaaaaaaaaaaaaaa")
        assert record is not None and record.uid == "u1" and record.groups == ("system:masters",)
        raw = b"".join(kv.value for kv in (await store.list(P))[0])
        assert b"tok-aaaa" not in raw
        # revoked, then a restart: the renamed file is not read again, nothing comes back
        await delete_token(store, P, digest("tok-aaaaaaaaaaaaaaaa")[:16])
        assert await import_token_file(store, P, csv) is None
        assert await refused_after(auth, "tok-aaaaaaaaaaaaaaaa", 1.0)
        # the same rows again (two masters on one state dir, a copy of an old file):
        # nothing new, and the revoked token does not come back
        csv.write_text("tok-aaaaaaaaaaaaaaaa,admin,u1,system:masters\ntok-bbbbbbbbbbbbbbbb,n,u2\n")
        assert await import_token_file(store, P, csv) == 0
        assert await auth.lookup("tok-aaaaaaaaaaaaaaaa") is None
    finally:
        await auth.stop()


async def test_creating_a_bootstrap_token_removes_the_expired_ones() -> None:
    store = FlakyStore()
    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=2)
    expired = "zzzzzz.0123456789abcdef"
    await put_new(store, P, expired, bootstrap_record(expired, datetime.timedelta(hours=1), at=old))
    node = await issue(store, P, "system:node:n1", ["system:nodes"])  # never expires
    made = await create_bootstrap(store, P)
    assert {t.id for t in await list_tokens(store, P)} == {made[:6], digest(node)[:16]}
