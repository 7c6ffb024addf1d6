"""The sealed control-plane certificates (``podnet.api.controlplanecerts``) and the etcd
member list a joining master starts with (``podnet.store.etcd_members``)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from podnet.api.controlplanecerts import (
    FILES,
    SETTINGS,
    SealError,
    expired,
    may_read,
    new_key,
    open_sealed,
    seal,
)
from podnet.api.identity import User
from podnet.store.etcd_members import Member, MembershipError, initial_cluster

NOW = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)
BUNDLE = {name: f"{name} text" for name in (*FILES, *SETTINGS)}


def test_what_is_sealed_opens_with_its_key_only() -> None:
    key = new_key()
    record = seal(BUNDLE, key, NOW, dt.timedelta(hours=2))
    assert b"ca.key text" not in record  # encrypted
    assert open_sealed(record, key, NOW + dt.timedelta(minutes=119)) == BUNDLE
    with pytest.raises(SealError, match="does not open"):
        open_sealed(record, new_key(), NOW)
    with pytest.raises(SealError, match="expired"):
        open_sealed(record, key, NOW + dt.timedelta(hours=2))
    assert expired(record, NOW + dt.timedelta(hours=2)) and not expired(record, NOW)


def test_a_stretched_expiry_does_not_open() -> None:
    key = new_key()
    value = json.loads(seal(BUNDLE, key, NOW, dt.timedelta(hours=2)))
    value["expires"] = "2030-01-01T00:00:00Z"  # someone who can write etcd, but has no key
    with pytest.raises(SealError, match="does not open"):
        open_sealed(json.dumps(value).encode(), key, NOW)


@pytest.mark.parametrize(
    "key", ["", "00" * 31, "0" * 63 + "g", ("ab" * 32).upper(), "ab" * 32 + "\n"]
)
def test_a_malformed_key_is_refused(key: str) -> None:
    with pytest.raises(SealError, match="64 lower-case hex"):
        seal(BUNDLE, key, NOW, dt.timedelta(hours=1))


@pytest.mark.parametrize(
    "record", [b"", b"{}", b"[1]", b'{"expires": "x", "nonce": "!", "ciphertext": ""}']
)
def test_a_malformed_record_is_refused(record: bytes) -> None:
    with pytest.raises(SealError):
        open_sealed(record, new_key(), NOW)


def test_a_bundle_lacking_a_file_is_not_sealed() -> None:
    partial = {k: v for k, v in BUNDLE.items() if k != "etcd-peer-ca.key"}
    with pytest.raises(SealError, match=r"etcd-peer-ca\.key"):
        seal(partial, new_key(), NOW, dt.timedelta(hours=1))


def test_who_may_read_the_sealed_record() -> None:
    assert may_read(User("admin", ("system:masters",))) is None
    bootstrap = ("system:bootstrappers",)
    assert may_read(User("system:bootstrap:abcdef", bootstrap)) is None
    bound = may_read(User("system:bootstrap:abcdef", bootstrap, bound_node="n1"))
    assert bound is not None and "bound to node 'n1'" in bound
    assert may_read(User("system:node:n1", ("system:nodes",))) is not None
    assert may_read(User("system:podnet:router:r", ("system:podnet:routers",))) is not None


def test_the_new_members_initial_cluster() -> None:
    running = [Member("m1", ("https://10.0.0.21:2380",))]
    url = "https://10.0.0.22:2380"
    expected = "m1=https://10.0.0.21:2380,m2=https://10.0.0.22:2380"
    assert initial_cluster(running, "m2", url) == expected
    added = [*running, Member("", (url,))]  # run again after the member was added
    assert initial_cluster(added, "m2", url) == expected
    with pytest.raises(MembershipError, match="named 'm1'"):
        initial_cluster(running, "m1", url)
    with pytest.raises(MembershipError, match="never started"):
        initial_cluster([*running, Member("", ("https://10.0.0.23:2380",))], "m2", url)
