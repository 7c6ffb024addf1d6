"""Certificate revocations (``podnet.api.certrevocation``): every certificate of a user
issued before the moment is refused, later ones are not, other users are untouched, and
a table that is not current refuses to decide (503)."""

from __future__ import annotations

import datetime as dt

import pytest

from podnet.api import certrevocation
from podnet.api.certrevocation import RevokedCertificates, revoke_certificates, revoked_key
from podnet.api.identity import User
from podnet.store.base import Put, StoreUnavailable
from podnet.store.memory import MemoryStore

P = "/t/"
NODE = User("system:node:n1", ("system:nodes",))


def issued(at: dt.datetime) -> dt.datetime:
    """The moment of issue of a certificate the signer issues at ``at`` (what
    ``podnet.api.pki.issued_at`` reads from it: tests/unit/test_cert_lifetime.py)."""
    return at


async def test_certificates_before_the_moment_are_revoked_later_ones_not() -> None:
    store = MemoryStore()
    table = RevokedCertificates(store, P)
    await table.start()
    try:
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        assert not table.revoked(NODE, 1, issued(now))
        moment = await revoke_certificates(store, P, NODE.name)
        await table._poll()
        assert table.revoked(NODE, 1, issued(now))
        assert table.revoked(NODE, 2, issued(moment - dt.timedelta(seconds=1)))
        assert not table.revoked(NODE, 3, issued(moment))  # issued after: a new join
        other = User("system:node:n2", ("system:nodes",))
        assert not table.revoked(other, 1, issued(now))
    finally:
        await table.stop()


async def test_a_bad_record_is_skipped_and_a_stale_table_refuses_to_decide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    await store.commit([], [Put(revoked_key(P, "x"), b"{not json")])
    table = RevokedCertificates(store, P)
    await table.start()
    try:
        now = dt.datetime.now(dt.UTC)
        assert not table.revoked(NODE, 1, now)
        monkeypatch.setattr(certrevocation, "FRESH_SECONDS", -1.0)
        with pytest.raises(StoreUnavailable):
            table.revoked(NODE, 1, now)
    finally:
        await table.stop()
