"""Who is calling: bearer tokens, and the legacy ``--token-auth-file`` format.

A master authenticates from the hashed token records in etcd that every master shares
(``podnet.api.tokenauth``, written by ``podnet.api.tokenissue``). ``TokenFile`` reads
kube-apiserver's ``--token-auth-file`` CSV, which a master imports into etcd once
(``tokenissue.import_token_file``) and never reads again. ``add_token`` and the
``ensure_*_token`` functions take the path of that file in a master's state dir: when a
master has run there (its ``etcd.json``), they issue a new token in etcd; else they add
it to the file, which the next master to start there imports. What each identity may
do is decided in ``podnet.api.authorizer`` (rules and
NodeRestriction); its names are re-exported here for the callers that predate the split.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import hmac
import io
import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from podnet.api.authorizer import (
    NON_RESOURCE_READ_VERBS,
    READ_VERBS,
    WRITE_VERBS,
    RequestAttributes,
    Rule,
    authorize,
    forbidden_error,
    forbidden_message,
    require_authorized,
    require_rule,
    rules_for,
)
from podnet.api.identity import (
    ADMIN_USER,
    CONTROLLERS_GROUP,
    CONTROLLERS_USER_PREFIX,
    MASTERS_GROUP,
    NODE_USER_PREFIX,
    NODES_GROUP,
    PROXIES_GROUP,
    PROXY_USER_PREFIX,
    ROUTER_USER_PREFIX,
    ROUTERS_GROUP,
    User,
    node_user,
)
from podnet.api.tokenauth import TokenAuthenticator, bearer_token
from podnet.api.tokencsv import parse_token_file, parse_token_rows
from podnet.api.tokenstore import StoreSettings, issue_sync
from podnet.files import write_atomic
from podnet.model.errors import unauthorized

__all__ = [
    "ADMIN_USER",
    "MASTERS_GROUP",
    "NODES_GROUP",
    "NODE_USER_PREFIX",
    "NON_RESOURCE_READ_VERBS",
    "PROXIES_GROUP",
    "READ_VERBS",
    "ROUTERS_GROUP",
    "WRITE_VERBS",
    "RequestAttributes",
    "Rule",
    "TokenAuthenticator",
    "TokenFile",
    "User",
    "add_token",
    "authorize",
    "ensure_admin_token",
    "ensure_controllers_token",
    "ensure_node_token",
    "ensure_proxy_token",
    "ensure_router_token",
    "forbidden_error",
    "forbidden_message",
    "node_user",
    "parse_token_file",
    "parse_token_rows",
    "require_authorized",
    "require_rule",
    "rules_for",
]

log = logging.getLogger(__name__)

# A known token skips the token file's ``os.stat`` for this long, so a token removed from
# the file stops working within about this many seconds. Unknown tokens always re-check.
RECHECK_SECONDS = 1.0

# --------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class _Entry:
    token: bytes
    user: User


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


_StatKey = tuple[int, int, int] | None


def _stat_key(path: Path) -> _StatKey:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class TokenFile:
    """Bearer tokens in kube's --token-auth-file CSV format: token,user,uid,"group1,group2".

    The file is re-read whenever its mtime, size or inode changes, so tokens added for new
    nodes work without restarting the master. The file is stat'ed at most once per
    ``RECHECK_SECONDS`` while requests present known tokens (a removed token stops working
    within that time), and again whenever a token is not found (a token just added works
    at once). A missing
    file means no tokens; an unreadable or malformed file on reload keeps the last good
    table (and logs why), but fails loudly when the file is first loaded.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._key: _StatKey = _stat_key(self.path)
        self._next_check = time.monotonic() + RECHECK_SECONDS
        self._entries = self._read()

    def _read(self) -> dict[bytes, _Entry]:
        if self._key is None:
            return {}
        table = parse_token_file(self.path.read_text(encoding="utf-8"), str(self.path))
        # Keyed by digest so lookup leaks nothing about the token; equality is then
        # confirmed with a constant-time compare.
        return {_digest(t.encode()): _Entry(t.encode(), u) for t, u in table.items()}

    def _refresh(self, force: bool = True) -> None:
        now = time.monotonic()
        if not force and now < self._next_check:
            return
        self._next_check = now + RECHECK_SECONDS
        key = _stat_key(self.path)
        if key == self._key:
            return
        with self._lock:
            if key == self._key:
                return
            previous_key, self._key = self._key, key
            try:
                self._entries = self._read()
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                self._key = previous_key  # retry on the next request
                log.warning("keeping previous tokens, cannot reload %s: %s", self.path, exc)

    def users(self) -> list[User]:
        """Every user the file currently knows (for diagnostics)."""
        self._refresh()
        return [e.user for e in self._entries.values()]

    def authenticate(self, authorization_header: str | None) -> User:
        """The user for an ``Authorization: Bearer <token>`` header; 401 otherwise."""
        presented = bearer_token(authorization_header).encode()
        digest = _digest(presented)
        self._refresh(force=False)
        entry = self._entries.get(digest)
        if entry is None:
            self._refresh()  # perhaps added since the last check
            entry = self._entries.get(digest)
        expected = entry.token if entry is not None else b""
        if not hmac.compare_digest(presented, expected) or entry is None:
            raise unauthorized()
        return entry.user

    async def authenticate_request(self, authorization_header: str | None) -> User:
        return self.authenticate(authorization_header)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialize writers of ``path`` across processes with a sidecar lock file."""
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _csv_row(fields: Sequence[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(fields)
    return buf.getvalue()


def add_token(path: Path, user: str, groups: Sequence[str]) -> str:
    """Give ``user`` a bearer token in the token file and return it.

    When a master has run in the file's directory (its ``etcd.json``), a new token is
    stored hashed in that master's etcd, where every master finds it. Else, in the file:
    a user that already has a token keeps it (its groups are not changed), and the file
    is rewritten atomically (temp file + rename, mode 0600) under an exclusive lock.
    """
    path = Path(path)
    settings = StoreSettings.load(path.parent)
    if settings is not None:
        return issue_sync(settings, user, groups, f"credentials of {user}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        for token, known in parse_token_file(text, str(path)).items():
            if known.name == user:
                return token
        token = secrets.token_urlsafe(32)
        if text and not text.endswith("\n"):
            text += "\n"
        text += _csv_row([token, user, str(uuid.uuid4()), ",".join(groups)])
        write_atomic(path, text)
        return token


def ensure_admin_token(path: Path) -> str:
    """The admin's token (user ``admin``, group ``system:masters``), created if needed."""
    return add_token(path, ADMIN_USER, [MASTERS_GROUP])


def ensure_node_token(path: Path, node: str) -> str:
    """The token of node ``node`` (user ``system:node:<node>``), created if needed."""
    if not node:
        raise ValueError("node name must not be empty")
    return add_token(path, node_user(node), [NODES_GROUP])


def ensure_proxy_token(path: Path, name: str) -> str:
    """The token of service proxy ``name`` (group ``system:podnet:proxies``)."""
    if not name:
        raise ValueError("proxy name must not be empty")
    return add_token(path, f"{PROXY_USER_PREFIX}{name}", [PROXIES_GROUP])


def ensure_controllers_token(path: Path, name: str) -> str:
    """The token of controllers instance ``name`` run as their own process (group
    ``system:podnet:controllers``: only what the controllers use)."""
    if not name:
        raise ValueError("controllers name must not be empty")
    return add_token(path, f"{CONTROLLERS_USER_PREFIX}{name}", [CONTROLLERS_GROUP])


def ensure_router_token(path: Path, name: str) -> str:
    """The token of router ``name`` (group ``system:podnet:routers``)."""
    if not name:
        raise ValueError("router name must not be empty")
    return add_token(path, f"{ROUTER_USER_PREFIX}{name}", [ROUTERS_GROUP])
