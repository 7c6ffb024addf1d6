"""The stored form of an API object, and how its bytes become wire bytes without decoding.

An object is stored as compact JSON with ``metadata`` as its first member and without
``metadata.resourceVersion`` (the etcd revision is the resourceVersion). So every stored
value starts with the fixed prefix ``{"metadata":{``, and ``splice`` inserts the
resourceVersion right after it: a list or watch event is assembled from stored bytes
without a ``json.loads``/``json.dumps`` round trip per object.

Splicing is safe because the prefix is checked and the member is known to be absent: a
value that does not start with the prefix (written before this form existed) or that holds
the text ``"resourceVersion"`` anywhere (a label could) takes the slow path, decode and
re-encode. ``tests/unit/test_api_storedform.py`` checks with hypothesis that both paths
give the same JSON value.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from podnet.api.objects import field_labels
from podnet.model.kinds import Kind
from podnet.model.selectors import field_value

Obj = dict[str, Any]
HEAD = b'{"metadata":{'
RV_MEMBER = b'"resourceVersion"'


# A run of 19 digits: an integer that may lie outside 64 bits, which orjson reads as a
# float where the json module keeps an exact int.
_LONG_NUMBER = re.compile(rb"\d{19}")


def dumps(obj: Any) -> bytes:
    """Compact JSON, as the API writes it (UTF-8, not ASCII escapes: both are JSON).

    orjson does the work; what it refuses (an integer beyond 64 bits, a key that is not
    a string) the json module writes as before."""
    try:
        return orjson.dumps(obj)
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(obj, separators=(",", ":")).encode()


def loads_fast(raw: bytes) -> Any:
    """orjson's reading of ``raw``; ValueError where it refuses the text, or where its
    value could differ from ``json.loads`` (a number of 19 or more digits)."""
    if _LONG_NUMBER.search(raw):
        raise ValueError("a number of 19 or more digits")
    return orjson.loads(raw)  # orjson.JSONDecodeError is a ValueError


def loads(raw: bytes) -> Any:
    """``json.loads(raw)``: the same value (or error), mostly read by orjson."""
    try:
        return loads_fast(raw)
    except ValueError:
        return json.loads(raw)


def encode(obj: Obj) -> bytes:
    """The stored bytes of ``obj``: metadata first, without its resourceVersion."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("resourceVersion", None)
    stored = {"metadata": meta}
    stored.update((k, v) for k, v in obj.items() if k != "metadata")
    return dumps(stored)


def decode(value: bytes, revision: int) -> Obj:
    """The API object of stored bytes, with ``revision`` as its resourceVersion."""
    obj: Obj = loads(value)
    obj.setdefault("metadata", {})["resourceVersion"] = str(revision)
    return obj


def splice(value: bytes, revision: int) -> bytes:
    """The wire JSON of stored bytes: ``decode(value, revision)`` encoded, done cheaply."""
    if value.startswith(HEAD) and RV_MEMBER not in value:
        rest = value[len(HEAD) :]
        member = b'"resourceVersion":"%d"' % revision
        return HEAD + member + (rest if rest[:1] == b"}" else b"," + rest)
    return dumps(decode(value, revision))


def probe(kind: Kind, obj: Obj) -> Obj:
    """The parts of ``obj`` a label or field selector of ``kind`` can look at.

    Kept per cached object instead of the whole decoded object: a few small dicts, so
    150,000 cached pods can be filtered without holding 150,000 decoded pods.
    """
    meta = obj.get("metadata") or {}
    small: Obj = {"metadata": {k: meta[k] for k in ("name", "namespace", "labels") if k in meta}}
    for path in field_labels(kind):
        if path.startswith("metadata."):
            continue
        value = field_value(obj, path)
        if not value:
            continue
        node = small
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return small
