"""Selector splitting: the fast path for text without a backslash splits exactly as the
escape-aware loop does (hypothesis, against a copy of that loop)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from podnet.model.selectors import _split_unescaped, parse_field_selector


def split_with_escapes(text: str, separator: str) -> list[str]:
    """The escape-aware loop, run on every text."""
    parts, start, escaped = [], 0, False
    for i, char in enumerate(text):
        if char == separator and not escaped:
            parts.append(text[start:i])
            start = i + 1
        escaped = char == "\\" and not escaped
    return [*parts, text[start:]]


@given(st.text(alphabet="ab=,!\\ .-", max_size=30), st.sampled_from([",", "="]))
def test_the_fast_split_splits_as_the_loop(text: str, separator: str) -> None:
    assert _split_unescaped(text, separator) == split_with_escapes(text, separator)


def test_escaped_and_plain_selectors_parse() -> None:
    plain = parse_field_selector("metadata.name=sim-00001,spec.nodeName!=n1", NAMES)
    assert [(r.field, r.op, r.value) for r in plain] == [
        ("metadata.name", "=", "sim-00001"),
        ("spec.nodeName", "!=", "n1"),
    ]
    escaped = parse_field_selector(r"metadata.name=a\,b", NAMES)
    assert [(r.field, r.op, r.value) for r in escaped] == [("metadata.name", "=", "a,b")]


NAMES = {"metadata.name", "spec.nodeName"}
