"""Who is calling (bearer tokens) and what they may do (admin / node authorization).

Authentication reads kube-apiserver's ``--token-auth-file`` format, so a token file works
with both. Authorization is a pure function of the user and the request: the admin
(group ``system:masters``) may do anything; a node (``system:node:<name>`` in group
``system:nodes``) may read everything but events, and may write only its own Node, the
Pods bound to it, and Events, the same limits kube's Node authorizer and NodeRestriction
admission plugin put on kubelets.
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
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podnet.files import write_atomic
from podnet.model.errors import ApiError, forbidden, unauthorized
from podnet.model.kinds import ALL_KINDS, EVENT, NODE, POD, Kind

log = logging.getLogger(__name__)

ADMIN_USER = "admin"
MASTERS_GROUP = "system:masters"
NODES_GROUP = "system:nodes"
NODE_USER_PREFIX = "system:node:"

READ_VERBS = frozenset({"get", "list", "watch"})
WRITE_VERBS = frozenset({"create", "update", "patch"})
# Non-resource requests carry the lowercase HTTP method as their verb (as in kube).
NON_RESOURCE_READ_VERBS = READ_VERBS | {"head"}
_WRITABLE_SUBRESOURCES = (None, "status")
_NODE_READABLE = frozenset((k.group, k.plural) for k in ALL_KINDS if k is not EVENT)


def _is(kind: Kind, other: Kind) -> bool:
    return (kind.group, kind.plural) == (other.group, other.plural)


@dataclass(frozen=True)
class User:
    """An authenticated caller."""

    name: str  # "admin", or "system:node:<nodename>"
    groups: tuple[str, ...]  # admin: ("system:masters",); node: ("system:nodes",)

    @property
    def node_name(self) -> str | None:
        """The node this user acts for, or None when it is not a node user."""
        if NODES_GROUP not in self.groups or not self.name.startswith(NODE_USER_PREFIX):
            return None
        return self.name[len(NODE_USER_PREFIX) :] or None

    @property
    def is_admin(self) -> bool:
        return MASTERS_GROUP in self.groups


def node_user(node: str) -> str:
    """The user name a node authenticates as."""
    return f"{NODE_USER_PREFIX}{node}"


# --------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class _Entry:
    token: bytes
    user: User


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def _parse_row(row: list[str], where: str) -> tuple[str, User]:
    if len(row) < 3 or not row[0] or not row[1]:
        raise ValueError(f'{where}: want token,user,uid[,"group1,group2"], got {row!r}')
    token, user = row[0].strip(), row[1].strip()
    groups = row[3].split(",") if len(row) > 3 else []
    return token, User(user, tuple(g.strip() for g in groups if g.strip()))


def parse_token_file(text: str, source: str = "<tokens>") -> dict[str, User]:
    """Parse token-file CSV text into token -> User; blank and ``#`` lines are skipped."""
    out: dict[str, User] = {}
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        token, user = _parse_row(row, f"{source}:{lineno}")
        out[token] = user
    return out


_StatKey = tuple[int, int, int] | None


def _stat_key(path: Path) -> _StatKey:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class TokenFile:
    """Bearer tokens in kube's --token-auth-file CSV format: token,user,uid,"group1,group2".

    The file is re-read whenever its mtime, size or inode changes (one ``os.stat`` per
    request), so tokens added for new nodes work without restarting the master. A missing
    file means no tokens; an unreadable or malformed file on reload keeps the last good
    table (and logs why), but fails loudly when the file is first loaded.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._key: _StatKey = _stat_key(self.path)
        self._entries = self._read()

    def _read(self) -> dict[bytes, _Entry]:
        if self._key is None:
            return {}
        table = parse_token_file(self.path.read_text(encoding="utf-8"), str(self.path))
        # Keyed by digest so lookup leaks nothing about the token; equality is then
        # confirmed with a constant-time compare.
        return {_digest(t.encode()): _Entry(t.encode(), u) for t, u in table.items()}

    def _refresh(self) -> None:
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
        token = _bearer_token(authorization_header)
        self._refresh()
        presented = token.encode()
        entry = self._entries.get(_digest(presented))
        expected = entry.token if entry is not None else b""
        if not hmac.compare_digest(presented, expected) or entry is None:
            raise unauthorized()
        return entry.user


def _bearer_token(header: str | None) -> str:
    if not header:
        raise unauthorized()
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        raise unauthorized()
    return token


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

    A user that already has a token keeps it (its groups are not changed). The file is
    rewritten atomically (temp file + rename, mode 0600) under an exclusive lock.
    """
    path = Path(path)
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


# -------------------------------------------------------------------- authorization


@dataclass(frozen=True)
class RequestAttributes:
    """What a request does, as the authorizer sees it."""

    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    kind: Kind | None  # None for non-resource paths (/api, /apis, /version, /metrics ...)
    namespace: str | None
    name: str | None
    subresource: str | None  # e.g. "status"
    new_object: Mapping[str, Any] | None  # body being written (after patch), if any
    old_object: Mapping[str, Any] | None  # stored object, if any
    path: str = ""


def _field(obj: Mapping[str, Any] | None, *path: str) -> Any:
    node: Any = obj
    for part in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def authorize(user: User, attrs: RequestAttributes) -> str | None:
    """Decide a request: None when allowed, else why it is denied."""
    if user.is_admin:
        return None
    if attrs.kind is None:
        if attrs.verb in NON_RESOURCE_READ_VERBS:
            return None
        return f"only reads are allowed on non-resource path {attrs.path or '/'!r}"
    node = user.node_name
    if node is None:
        return "only the admin and nodes may access resources"
    return _authorize_node(node, attrs)


def _authorize_node(node: str, attrs: RequestAttributes) -> str | None:
    kind = attrs.kind
    assert kind is not None
    if attrs.verb in READ_VERBS:
        if (kind.group, kind.plural) in _NODE_READABLE:
            return None
        return f"a node may not read {kind.plural}"
    if _is(kind, NODE):
        return _node_writes_node(node, attrs)
    if _is(kind, POD):
        return _node_writes_pod(node, attrs)
    if _is(kind, EVENT):
        if attrs.verb == "create" and attrs.subresource is None:
            return None
        return "a node may only create events"
    return f"a node may not {attrs.verb} {kind.plural}"


def _node_writes_node(node: str, attrs: RequestAttributes) -> str | None:
    if attrs.verb not in WRITE_VERBS or attrs.subresource not in _WRITABLE_SUBRESOURCES:
        return f"a node may not {attrs.verb} Node objects"
    names = [attrs.name, _field(attrs.new_object, "metadata", "name")]
    if attrs.verb == "create" and names[1] is None:
        return "a node may only create its own Node: the object has no metadata.name"
    if attrs.verb != "create" and attrs.name is None:
        return "a node may only modify its own Node: no name given"
    if any(n is not None and n != node for n in names):
        return "a node may only modify its own Node"
    return None


def _node_writes_pod(node: str, attrs: RequestAttributes) -> str | None:
    if attrs.verb not in WRITE_VERBS | {"delete"}:
        return f"a node may not {attrs.verb} pods"
    if attrs.subresource not in _WRITABLE_SUBRESOURCES:
        return f"a node may not {attrs.verb} pods/{attrs.subresource}"
    if attrs.verb == "delete":
        if attrs.old_object is None:
            return "a node may only delete pods bound to it: the pod's node is unknown"
        objects = [attrs.old_object]
    else:
        if attrs.new_object is None:
            return f"a node may only {attrs.verb} pods bound to it: no object given"
        objects = [attrs.new_object, *([attrs.old_object] if attrs.old_object else [])]
    for obj in objects:
        bound = _field(obj, "spec", "nodeName")
        if bound != node:
            where = f'on node "{bound}"' if bound else "not bound to a node"
            return f"a node may only modify pods bound to it, this pod is {where}"
    return None


def forbidden_message(user: User, attrs: RequestAttributes, reason: str) -> str:
    """kube-apiserver's wording for a denied request."""
    if attrs.kind is None:
        return (
            f'forbidden: User "{user.name}" cannot {attrs.verb} path '
            f'"{attrs.path or "/"}": {reason}'
        )
    kind = attrs.kind
    resource = f"{kind.plural}.{kind.group}" if kind.group else kind.plural
    subject = f'{resource} "{attrs.name}"' if attrs.name else resource
    full = f"{kind.plural}/{attrs.subresource}" if attrs.subresource else kind.plural
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    return (
        f'{subject} is forbidden: User "{user.name}" cannot {attrs.verb} resource '
        f'"{full}" in API group "{kind.group}" {scope}: {reason}'
    )


def require_authorized(user: User, attrs: RequestAttributes) -> None:
    """Raise 403 Forbidden (with kube's message) unless ``authorize`` allows the request."""
    reason = authorize(user, attrs)
    if reason is not None:
        raise forbidden_error(user, attrs, reason)


def forbidden_error(user: User, attrs: RequestAttributes, reason: str) -> ApiError:
    """The 403 ``ApiError`` for a denied request, with kind and name in its details."""
    err = forbidden(forbidden_message(user, attrs, reason))
    if attrs.kind is not None:
        err.kind = attrs.kind.plural
        err.name = attrs.name
    return err
