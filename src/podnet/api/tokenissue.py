"""Writing token records: issue, list, delete, and import a legacy ``tokens.csv``.

Each function works on a ``Store`` and the master's key prefix; only the token's digest
and what it stands for are written (``podnet.api.tokenrecords``), the token itself is
returned once to the caller and never stored.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from podnet.api.identity import ADMIN_USER, MASTERS_GROUP
from podnet.api.tokencsv import parse_token_rows
from podnet.api.tokenrecords import (
    DEFAULT_TTL,
    RecordError,
    TokenRecord,
    bootstrap_record,
    check_bootstrap_id,
    component_record,
    decode,
    digest,
    digest_of_key,
    encode,
    new_bootstrap_token,
    new_token,
    now,
    token_key,
    tokens_prefix,
    usable,
)
from podnet.store.base import Absent, Delete, ModRevisionIs, Put, Store

log = logging.getLogger(__name__)

IMPORTED_SUFFIX = ".imported"
_HEX_ID = re.compile(r"[0-9a-f]{12,64}")


def imported_key(prefix: str, hex_digest: str) -> str:
    """The marker of a token imported from a tokens.csv (outside the records' prefix)."""
    return tokens_prefix(prefix).removesuffix("tokens/") + "imported/" + hex_digest


@dataclass(frozen=True)
class StoredToken:
    """One record as listed: its digest (the key's last part) and what it stands for."""

    digest: str
    record: TokenRecord
    revision: int

    @property
    def id(self) -> str:
        """The bootstrap token's public id, else the digest's first 16 hex digits."""
        return self.record.bootstrap_id or self.digest[:16]


async def put_new(store: Store, prefix: str, token: str, record: TokenRecord) -> bool:
    """Store ``record`` for ``token`` unless a record of that token exists; True if stored."""
    key = token_key(prefix, digest(token))
    return await store.commit([Absent(key)], [Put(key, encode(record))]) is not None


async def issue(
    store: Store, prefix: str, user: str, groups: Sequence[str], description: str = ""
) -> str:
    """A new token for ``user`` in ``groups`` (a component's: it does not expire)."""
    record = component_record(user, groups, description)
    for _ in range(3):
        token = new_token()
        if await put_new(store, prefix, token, record):
            return token
    raise RecordError("could not store a new token (digest collisions)")


async def list_tokens(store: Store, prefix: str) -> list[StoredToken]:
    """Every token record, in key order; records that do not decode are skipped (logged)."""
    items, _ = await store.list(tokens_prefix(prefix))
    out = []
    for kv in items:
        hex_digest = digest_of_key(prefix, kv.key)
        if hex_digest is None:
            continue
        try:
            out.append(StoredToken(hex_digest, decode(kv.value), kv.mod_revision))
        except RecordError as exc:
            log.warning("skipping the token record %s: %s", hex_digest[:16], exc)
    return out


async def create_bootstrap(
    store: Store,
    prefix: str,
    ttl: datetime.timedelta = DEFAULT_TTL,
    node: str | None = None,
    description: str = "",
) -> str:
    """A new bootstrap token ``id.secret`` whose id no other record has. Expired bootstrap
    tokens are deleted on the way (kubeadm's token cleaner does so too)."""
    known = await list_tokens(store, prefix)
    for stored in known:
        if stored.record.bootstrap_id is not None and stored.record.expired():
            key = token_key(prefix, stored.digest)
            await store.commit([ModRevisionIs(key, stored.revision)], [Delete(key)])
    taken = {t.record.bootstrap_id for t in known}
    for _ in range(5):
        token = new_bootstrap_token()
        if token[:6] in taken:
            continue
        if await put_new(store, prefix, token, bootstrap_record(token, ttl, node, description)):
            return token
    raise RecordError("could not find a free bootstrap token id")


def _matches(stored: StoredToken, ident: str) -> bool:
    if stored.record.bootstrap_id is not None and stored.record.bootstrap_id == ident:
        return True
    return bool(_HEX_ID.fullmatch(ident)) and stored.digest.startswith(ident)


async def delete_token(store: Store, prefix: str, ident: str) -> StoredToken:
    """Delete the token ``ident`` names: a bootstrap token's id, or 12+ hex digits that
    begin one token's digest (as ``adm token list`` shows). ``RecordError`` (and nothing
    deleted) for an id that names no token, or more than one."""
    if not (_HEX_ID.fullmatch(ident) or re.fullmatch(r"[a-z0-9]{6}", ident)):
        check_bootstrap_id(ident)  # raises with the bootstrap id's format
    found = [t for t in await list_tokens(store, prefix) if _matches(t, ident)]
    if not found:
        raise RecordError(f"no token with id {ident!r}")
    if len(found) > 1:
        raise RecordError(f"{ident!r} names {len(found)} tokens: give more digits")
    stored = found[0]
    key = token_key(prefix, stored.digest)
    if await store.commit([ModRevisionIs(key, stored.revision)], [Delete(key)]) is None:
        raise RecordError(f"token {ident!r} changed or was deleted meanwhile; nothing done")
    return stored


async def spend_bootstrap(store: Store, prefix: str, ident: str) -> bool:
    """Mark the node-bound bootstrap token ``ident`` spent (its node's certificate was
    issued); False when there is no such token, it is bound to no node, or it was
    spent already."""
    found = [t for t in await list_tokens(store, prefix) if t.record.bootstrap_id == ident]
    if len(found) != 1 or found[0].record.node is None or found[0].record.spent is not None:
        return False
    stored = found[0]
    key = token_key(prefix, stored.digest)
    value = encode(stored.record.spend(now()))
    return await store.commit([ModRevisionIs(key, stored.revision)], [Put(key, value)]) is not None


async def ensure_admin(store: Store, prefix: str, current: str | None, name: str) -> str:
    """The admin token of master ``name``: ``current`` (its kubeconfig's) while its record
    still says admin, else a new one (user ``admin``, group ``system:masters``)."""
    if current:
        kv = await store.get(token_key(prefix, digest(current)))
        if kv is not None:
            try:
                record = decode(kv.value)
            except RecordError:
                record = None
            admin = record is not None and record.user == ADMIN_USER
            if admin and record is not None and MASTERS_GROUP in record.groups and usable(record):
                return current
    return await issue(store, prefix, ADMIN_USER, [MASTERS_GROUP], f"admin of master {name}")


async def import_token_file(store: Store, prefix: str, path: Path) -> int | None:
    """Copy the rows of a legacy ``tokens.csv`` into the store (rows already there are
    left as they are: idempotent), then rename the file ``tokens.csv.imported`` so it is
    never read again (a token deleted from the store is not brought back). The number of
    rows imported, or None when there is no file. A row imported once is never imported
    again, also after its token was deleted (see ``imported_key``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    imported = 0
    for token, user, uid in parse_token_rows(text, str(path)):
        record = component_record(user.name, user.groups, f"imported from {path.name}")
        record = replace(record, uid=uid) if uid else record
        # A marker per imported digest, left when the token is deleted: a copy of an old
        # tokens.csv (another master's, a backup) never brings a revoked token back.
        key, marker = token_key(prefix, digest(token)), imported_key(prefix, digest(token))
        put = [Put(key, encode(record)), Put(marker, b"")]
        imported += await store.commit([Absent(key), Absent(marker)], put) is not None
    with contextlib.suppress(FileNotFoundError):  # another master renamed it first
        path.rename(path.with_name(path.name + IMPORTED_SUFFIX))
    return imported
