"""Stored bytes spliced with a resourceVersion equal the decoded object re-encoded."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from podnet.api import storedform
from podnet.model.kinds import KINDS

TEXT = st.text(max_size=12)
SCALARS = st.none() | st.booleans() | st.integers() | TEXT
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=12,
)
# Keys that matter to splicing, mixed with arbitrary ones.
KEYS = st.sampled_from(["resourceVersion", "name", "labels", "metadata", "uid"]) | TEXT
METADATA = st.dictionaries(KEYS, JSON_VALUES, max_size=5)
OBJECTS = st.builds(
    lambda meta, rest: {**rest, "metadata": meta},
    METADATA,
    st.dictionaries(KEYS.filter(lambda k: k != "metadata"), JSON_VALUES, max_size=4),
)
REVISIONS = st.integers(min_value=1, max_value=2**63 - 1)


@given(OBJECTS, REVISIONS)
def test_splice_equals_decode_then_encode(obj: dict[str, Any], revision: int) -> None:
    stored = storedform.encode(obj)
    assert stored.startswith(storedform.HEAD)
    spliced = json.loads(storedform.splice(stored, revision))
    assert spliced == storedform.decode(stored, revision)
    assert spliced["metadata"]["resourceVersion"] == str(revision)


@given(st.dictionaries(KEYS, JSON_VALUES, max_size=5), REVISIONS)
def test_splice_of_any_stored_json_object(obj: dict[str, Any], revision: int) -> None:
    """Bytes in an older form (any key order, a resourceVersion kept) take the slow path."""
    stored = json.dumps(obj).encode()
    if not isinstance(obj.get("metadata", {}), dict):
        return  # not an API object: never stored
    assert json.loads(storedform.splice(stored, revision)) == storedform.decode(stored, revision)


def test_stored_form_drops_the_resource_version_and_leads_with_metadata() -> None:
    stored = storedform.encode({"kind": "Pod", "metadata": {"name": "a", "resourceVersion": "7"}})
    assert stored == b'{"metadata":{"name":"a"},"kind":"Pod"}'
    assert (
        storedform.splice(stored, 9)
        == b'{"metadata":{"resourceVersion":"9","name":"a"},"kind":"Pod"}'
    )
    assert storedform.splice(b'{"metadata":{}}', 3) == b'{"metadata":{"resourceVersion":"3"}}'


def test_probe_answers_field_selectors_like_the_object() -> None:
    pod = KINDS.by_kind("v1", "Pod")
    assert pod is not None
    obj = {
        "metadata": {"name": "p", "namespace": "n", "labels": {"a": "b"}, "uid": "u"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.5"},
    }
    probe = storedform.probe(pod, obj)
    assert probe == {
        "metadata": {"name": "p", "namespace": "n", "labels": {"a": "b"}},
        "spec": {"nodeName": "node-1"},
        "status": {"phase": "Running", "podIP": "10.0.0.5"},
    }
