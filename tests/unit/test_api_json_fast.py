"""The API's JSON through orjson reads and writes exactly what the json module did."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from podnet.api import decode, storedform
from podnet.model import errors

TEXT = st.text(max_size=12)  # any code point, lone surrogates included
NUMBERS = st.integers() | st.floats(allow_nan=False, allow_infinity=False)
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=12,
)
# Bytes that are almost JSON: the json module's text of a value, cut, padded or mangled.
NEAR_JSON = st.builds(
    lambda value, ascii_only, cut, extra: (
        json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")[: cut or None]
        + extra
    ),
    JSON_VALUES,
    st.booleans(),
    st.integers(min_value=0, max_value=30),
    st.sampled_from([b"", b" ", b",", b"]", b"\xff", b"NaN", b"1e400", b"\x01"]),
)


def _outcome(read: Any, raw: Any) -> tuple[str, Any]:
    try:
        return "value", read(raw)
    except errors.ApiError as exc:
        return "api error", (exc.code, str(exc))
    except Exception as exc:
        return "error", type(exc).__name__


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 and 1.0 differ here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@given(JSON_VALUES | NEAR_JSON)
def test_loads_gives_what_the_json_module_gives(value: Any) -> None:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    ours, theirs = _outcome(storedform.loads, raw), _outcome(json.loads, raw)
    assert ours[0] == theirs[0]
    assert _same(ours[1], theirs[1]) if ours[0] == "value" else ours == theirs


@given(JSON_VALUES)
def test_dumps_reads_back_as_the_same_value(value: Any) -> None:
    try:
        json.dumps(value).encode()
    except UnicodeEncodeError:
        return  # a lone surrogate: the API refuses such text before it is ever written
    assert _same(json.loads(storedform.dumps(value)), value)


@given(NEAR_JSON)
def test_request_bodies_decode_as_by_the_json_module(raw: bytes) -> None:
    """``loads_json`` of bytes (the orjson path) against the same text as ``str``, which
    the json module reads: same value, or the same 400 with the same message."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return
    fast, slow = _outcome(decode.loads_json, raw), _outcome(decode.loads_json, text)
    assert fast[0] == slow[0]
    assert _same(fast[1], slow[1]) if fast[0] == "value" else fast == slow


@pytest.mark.parametrize(
    "raw",
    [b"12345678901234567890123", b'{"n":-9223372036854775809}', b'{"n":18446744073709551616}'],
)
def test_numbers_beyond_64_bits_stay_exact_integers(raw: bytes) -> None:
    assert _same(storedform.loads(raw), json.loads(raw))
    assert _same(decode.loads_json(raw), json.loads(raw))


def test_non_ascii_text_is_written_as_utf8() -> None:
    assert storedform.dumps({"a": "é", "n": 2**70}) == b'{"a":"\\u00e9","n":1180591620717411303424}'
    assert storedform.dumps({"a": "é"}) == '{"a":"é"}'.encode()
