"""Bearer tokens as etcd records: keys, values and bootstrap tokens, as pure functions.

Every master authenticates from the same records, so a token issued anywhere works on
every master at once. A token is stored HASHED, one key per token:
``{prefix}identities/tokens/{sha256 hex of the token}``, outside the object kinds of
``podnet.api.keyspace`` (never served by the API). The value is JSON::

    {"user": ..., "uid": ..., "groups": [...], "created": RFC 3339,
     "expires": RFC 3339 (optional), "usages": [...] (optional),
     "node": node name a bootstrap token is bound to (optional), "description": ...}

Tokens are 32 random bytes (``secrets.token_urlsafe``) or kubeadm-style bootstrap tokens
``[a-z0-9]{6}.[a-z0-9]{16}`` (id.secret, 82 bits of secret): a plain SHA-256 suffices
for such high-entropy secrets (no salt or slow hash is needed: there is no dictionary).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import secrets
import string
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from podnet.api.identity import BOOTSTRAP_USER_PREFIX, BOOTSTRAPPERS_GROUP, User
from podnet.model.schemas_names import dns_subdomain_problem

TOKENS_DIR = "identities/tokens/"
BOOTSTRAP_TOKEN = re.compile(r"([a-z0-9]{6})\.([a-z0-9]{16})")
BOOTSTRAP_ID = re.compile(r"[a-z0-9]{6}")
BOOTSTRAP_USAGE = "authentication"
DEFAULT_TTL = datetime.timedelta(hours=24)
MAX_TTL = datetime.timedelta(days=365)
_ALPHABET = string.ascii_lowercase + string.digits
_TTL = re.compile(r"(\d+)(s|m|h|d)")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_FIELDS = {
    "user", "uid", "groups", "created", "expires", "usages", "node", "description", "spent",
}  # fmt: skip
# A node-bound bootstrap token, once its node's certificate is issued, lives this long
# more (the joining host reads its certificate) and asks for nothing again.
SPENT_GRACE = datetime.timedelta(minutes=5)


class RecordError(ValueError):
    """A stored token record, or an input for one, that is not valid."""


def tokens_prefix(prefix: str) -> str:
    """Where the token records of the store prefix ``prefix`` live."""
    return (prefix if prefix.endswith("/") else prefix + "/") + TOKENS_DIR


def digest(token: str | bytes) -> str:
    """The hex SHA-256 of a token: its record's key (the token itself is never stored)."""
    raw = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(raw).hexdigest()


def token_key(prefix: str, hex_digest: str) -> str:
    return tokens_prefix(prefix) + hex_digest


def digest_of_key(prefix: str, key: str) -> str | None:
    """The digest a record key names, or None for a key that is not a token record."""
    base = tokens_prefix(prefix)
    if not key.startswith(base):
        return None
    rest = key[len(base) :]
    return rest if re.fullmatch(r"[0-9a-f]{64}", rest) else None


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)  # as stored


def _time(value: datetime.datetime) -> str:
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: Any, name: str) -> datetime.datetime:
    if not isinstance(value, str):
        raise RecordError(f"{name} must be an RFC 3339 time, got {value!r}")
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise RecordError(f"{name} must be an RFC 3339 time, got {value!r}") from exc
    if parsed.tzinfo is None:
        raise RecordError(f"{name} must carry a time zone, got {value!r}")
    return parsed


@dataclass(frozen=True)
class TokenRecord:
    """What one stored token stands for."""

    user: str
    groups: tuple[str, ...]
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    created: datetime.datetime = field(default_factory=now)
    expires: datetime.datetime | None = None
    usages: tuple[str, ...] = ()
    node: str | None = None  # the node a bootstrap token is bound to (None: any node)
    description: str = ""
    # When the bound node's certificate was issued with this token: it asks for no more.
    spent: datetime.datetime | None = None

    def expired(self, at: datetime.datetime | None = None) -> bool:
        return self.expires is not None and (at or now()) >= self.expires

    def identity(self) -> User:
        return User(self.user, self.groups, bound_node=self.node, spent=self.spent is not None)

    def spend(self, at: datetime.datetime) -> TokenRecord:
        """This record once its node's certificate is issued: spent, expiring soon."""
        until = at + SPENT_GRACE
        expires = until if self.expires is None else min(self.expires, until)
        return replace(self, spent=at, expires=expires)

    @property
    def bootstrap_id(self) -> str | None:
        """The public id of a bootstrap token, or None for other tokens."""
        if BOOTSTRAPPERS_GROUP not in self.groups:
            return None
        rest = self.user.removeprefix(BOOTSTRAP_USER_PREFIX)
        return rest if rest != self.user and BOOTSTRAP_ID.fullmatch(rest) else None


def encode(record: TokenRecord) -> bytes:
    value: dict[str, Any] = {
        "user": record.user,
        "uid": record.uid,
        "groups": list(record.groups),
        "created": _time(record.created),
        "description": record.description,
    }
    if record.expires is not None:
        value["expires"] = _time(record.expires)
    if record.usages:
        value["usages"] = list(record.usages)
    if record.node is not None:
        value["node"] = record.node
    if record.spent is not None:
        value["spent"] = _time(record.spent)
    return json.dumps(value, sort_keys=True).encode()


def _strings(value: Any, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RecordError(f"{name} must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def decode(raw: bytes) -> TokenRecord:
    """A stored record; ``RecordError`` for anything that is not exactly one."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordError(f"not JSON: {exc}") from exc
    if not isinstance(value, Mapping):
        raise RecordError("a token record must be a JSON object")
    unknown = set(value) - _FIELDS
    if unknown:
        raise RecordError(f"unknown fields {sorted(unknown)}")
    user, uid, description = value.get("user"), value.get("uid"), value.get("description", "")
    if not isinstance(user, str) or not user:
        raise RecordError(f"user must be a non-empty string, got {user!r}")
    if not isinstance(uid, str) or not uid:
        raise RecordError(f"uid must be a non-empty string, got {uid!r}")
    if not isinstance(description, str):
        raise RecordError("description must be a string")
    node = value.get("node")
    if node is not None and (not isinstance(node, str) or dns_subdomain_problem(node)):
        raise RecordError(f"node must be a node name, got {node!r}")
    expires, spent = value.get("expires"), value.get("spent")
    return TokenRecord(
        user=user,
        groups=_strings(value.get("groups", []), "groups"),
        uid=uid,
        created=_parse_time(value.get("created"), "created"),
        expires=None if expires is None else _parse_time(expires, "expires"),
        usages=_strings(value.get("usages", []), "usages"),
        node=node,
        description=description,
        spent=None if spent is None else _parse_time(spent, "spent"),
    )


def new_token() -> str:
    """A long-lived token for a component: 32 random bytes, URL-safe base64."""
    return secrets.token_urlsafe(32)


def new_bootstrap_token() -> str:
    """``[a-z0-9]{6}.[a-z0-9]{16}``, both parts from the OS's random source."""
    pick = secrets.choice
    return (
        "".join(pick(_ALPHABET) for _ in range(6))
        + "."
        + "".join(pick(_ALPHABET) for _ in range(16))
    )


def parse_ttl(text: str) -> datetime.timedelta:
    """``90s``, ``15m``, ``24h``, ``7d`` or combinations (``1h30m``); > 0 and <= 365 days."""
    value = text.strip()
    if not value or _TTL.sub("", value):
        raise RecordError(f"bad ttl {text!r}: want a duration such as 30m, 24h or 7d")
    seconds = sum(int(n) * _UNITS[unit] for n, unit in _TTL.findall(value))
    ttl = datetime.timedelta(seconds=seconds)
    if ttl <= datetime.timedelta(0):
        raise RecordError(f"bad ttl {text!r}: it must be longer than 0s")
    if ttl > MAX_TTL:
        raise RecordError(f"bad ttl {text!r}: at most {MAX_TTL.days}d")
    return ttl


def check_node_name(name: str) -> str:
    problem = dns_subdomain_problem(name)
    if problem:
        raise RecordError(f"bad node name {name!r}: {problem}")
    return name


def check_bootstrap_id(value: str) -> str:
    if not BOOTSTRAP_ID.fullmatch(value):
        raise RecordError(f"bad token id {value!r}: want 6 characters of [a-z0-9]")
    return value


def bootstrap_record(
    token: str,
    ttl: datetime.timedelta = DEFAULT_TTL,
    node: str | None = None,
    description: str = "",
    at: datetime.datetime | None = None,
) -> TokenRecord:
    """The record of bootstrap token ``token`` (user ``system:bootstrap:<id>``)."""
    match = BOOTSTRAP_TOKEN.fullmatch(token)
    if match is None:
        raise RecordError("a bootstrap token is [a-z0-9]{6}.[a-z0-9]{16}")
    created = at or now()
    return TokenRecord(
        user=BOOTSTRAP_USER_PREFIX + match.group(1),
        groups=(BOOTSTRAPPERS_GROUP,),
        created=created,
        expires=created + ttl,
        usages=(BOOTSTRAP_USAGE,),
        node=None if node is None else check_node_name(node),
        description=description,
    )


def component_record(user: str, groups: Sequence[str], description: str = "") -> TokenRecord:
    if not user:
        raise RecordError("user must not be empty")
    return TokenRecord(user=user, groups=tuple(groups), description=description)


def usable(record: TokenRecord, at: datetime.datetime | None = None) -> bool:
    """Whether ``record`` may authenticate now: not expired, and a bootstrap token only
    with the ``authentication`` usage."""
    if record.expired(at):
        return False
    return record.bootstrap_id is None or BOOTSTRAP_USAGE in record.usages
