"""The control plane's keys for a further master, sealed (kubeadm's ``--certificate-key``).

``podnet adm certs upload`` on a master seals what a new master needs and cannot make
itself (the API's CA pair, etcd's client and peer CA pairs) and the cluster's settings
every master must give alike (networks, plugin, etcd's client endpoints) with AES-256-GCM
under a fresh random 32-byte key. It writes the sealed record to etcd under
``{prefix}identities/control-plane-certs`` (outside the API's object kinds) and prints
the key once; the key is never stored. ``podnet adm join master --certificate-key KEY``
reads the record through ``GET /control-plane-certs`` (a bootstrap token not bound to a
node, or the admin) and opens it.

The record carries its own expiry (2 h by default) as authenticated data, so it cannot
be stretched without the key; an expired record is not served. Who reads the record
without the key learns nothing; who has the key but no token cannot read the record.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from podnet.api.handlers import USER, json_response
from podnet.api.identity import User
from podnet.model import errors
from podnet.store.base import Store

PATH = "/control-plane-certs"
RECORD = "identities/control-plane-certs"
KIND = "ControlPlaneCerts"
API_VERSION = "podnet.io/v1"
DEFAULT_TTL = dt.timedelta(hours=2)
KEY_BYTES = 32
KEY_TEXT = re.compile(r"[0-9a-f]{64}")
_AAD = b"podnet control-plane-certs v1\n"
# What a bundle holds: PEM texts, and the settings every master gives alike.
FILES = (
    "ca.crt", "ca.key",
    "etcd-ca.crt", "etcd-ca.key",
    "etcd-peer-ca.crt", "etcd-peer-ca.key",
)  # fmt: skip
SETTINGS = ("CLUSTER_NETWORK", "SERVICE_NETWORK", "NETWORK_PLUGIN", "ETCD_ENDPOINTS")


class SealError(ValueError):
    """A key, record or bundle that is not valid, or a key that does not open a record."""


def record_key(prefix: str) -> str:
    return (prefix if prefix.endswith("/") else prefix + "/") + RECORD


def new_key() -> str:
    """A fresh certificate key, as 64 hex digits."""
    return os.urandom(KEY_BYTES).hex()


def parse_key(text: str) -> bytes:
    if not KEY_TEXT.fullmatch(text):
        raise SealError("a certificate key is 64 lower-case hex digits (adm certs upload)")
    return bytes.fromhex(text)


def _stamp(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_bundle(bundle: Mapping[str, Any]) -> dict[str, str]:
    """The bundle's files and settings as strings; SealError names what is missing."""
    missing = [name for name in (*FILES, *SETTINGS) if not isinstance(bundle.get(name), str)]
    if missing:
        raise SealError(f"the control-plane bundle lacks {', '.join(missing)}")
    return {name: str(bundle[name]) for name in (*FILES, *SETTINGS)}


def seal(bundle: Mapping[str, Any], key: str, now: dt.datetime, ttl: dt.timedelta) -> bytes:
    """The etcd value: the bundle encrypted under ``key``, valid until ``now + ttl``."""
    expires = _stamp(now + ttl)
    nonce = os.urandom(12)
    plain = json.dumps(check_bundle(bundle), sort_keys=True).encode()
    sealed = AESGCM(parse_key(key)).encrypt(nonce, plain, _AAD + expires.encode())
    record = {
        "expires": expires,
        "nonce": base64.b64encode(nonce).decode(),
        "ciphertext": base64.b64encode(sealed).decode(),
    }
    return json.dumps(record).encode()


def _fields(record: bytes) -> tuple[str, bytes, bytes]:
    try:
        value = json.loads(record)
        expires = str(value["expires"])
        nonce = base64.b64decode(value["nonce"], validate=True)
        sealed = base64.b64decode(value["ciphertext"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise SealError("the control-plane record is not valid") from exc
    return expires, nonce, sealed


def expired(record: bytes, now: dt.datetime) -> bool:
    expires, _, _ = _fields(record)
    try:
        until = dt.datetime.strptime(expires, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError as exc:
        raise SealError("the control-plane record's expiry is not a time") from exc
    return now >= until


def open_sealed(record: bytes, key: str, now: dt.datetime) -> dict[str, str]:
    """The bundle in ``record``; SealError when it has expired or ``key`` does not open it."""
    expires, nonce, sealed = _fields(record)
    if expired(record, now):
        raise SealError(f"the control-plane certificates expired at {expires}: upload again")
    try:
        plain = AESGCM(parse_key(key)).decrypt(nonce, sealed, _AAD + expires.encode())
    except InvalidTag as exc:
        raise SealError("the certificate key does not open the uploaded certificates") from exc
    return check_bundle(json.loads(plain))


def document(record: bytes) -> dict[str, Any]:
    return {"kind": KIND, "apiVersion": API_VERSION, "record": record.decode()}


def parse_document(body: Any) -> bytes:
    if not isinstance(body, dict) or body.get("kind") != KIND or "record" not in body:
        raise SealError("not a ControlPlaneCerts answer")
    return str(body["record"]).encode()


def may_read(user: User) -> str | None:
    """Why ``user`` may not read the sealed record, or None: the admin, and bootstrap
    tokens that are not bound to a node (a node's token joins that node only)."""
    if user.is_admin:
        return None
    if not user.is_bootstrapper:
        return "only a bootstrap token or the admin may read the control-plane certificates"
    if user.bound_node is not None:
        return (
            f"this bootstrap token is bound to node {user.bound_node!r}: a master joins "
            "with a token made without --node"
        )
    return None


class ControlPlaneCerts:
    """``GET /control-plane-certs``: the sealed record, to those ``may_read`` admits."""

    def __init__(self, store: Store, prefix: str) -> None:
        self.store = store
        self.key = record_key(prefix)

    async def handle(self, request: web.Request) -> web.Response:
        why = may_read(request[USER])
        if why is not None:
            raise errors.forbidden(why)
        found = await self.store.get(self.key)
        now = dt.datetime.now(dt.UTC)
        try:
            gone = found is None or expired(found.value, now)
        except SealError:
            gone = True
        if gone or found is None:
            raise errors.ApiError(
                "no control-plane certificates uploaded, or they expired: run "
                "`podnet adm certs upload` on a master",
                404,
                "NotFound",
            )
        return json_response(document(found.value))
