"""Pure parts of the API entry point: query parameters, strict decoding and patches."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.api import decode, params
from podnet.api.patch import JSON_PATCH, MERGE, STRATEGIC, patcher
from podnet.model.errors import ApiError


def test_valid_query_is_typed() -> None:
    token = params.ContinueToken(42, "default/web").encode()
    parsed = params.parse_query(
        {"limit": "2", "continue": token, "watch": "false", "timeoutSeconds": "7"}
    )
    assert parsed.limit == 2 and parsed.continue_token == params.ContinueToken(42, "default/web")
    assert params.watch_timeout(parsed) == 7.0
    assert params.parse_query({"resourceVersion": "0"}).resource_version == 0
    assert params.parse_query({}).resource_version is None


@settings(max_examples=500, derandomize=True)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "limit",
                "continue",
                "watch",
                "resourceVersion",
                "timeoutSeconds",
                "resourceVersionMatch",
                "dryRun",
                "fieldManager",
                "gracePeriodSeconds",
            ]
        ),
        st.text(max_size=30),
    )
)
def test_any_query_is_parsed_or_400(query: dict[str, str]) -> None:
    try:
        params.parse_query(query)
    except ApiError as exc:
        assert exc.code == 400


@pytest.mark.parametrize(
    "options",
    [
        {"preconditions": [1]},
        {"preconditions": {"uid": 1}},
        "x",
        {"kind": "Pod"},
        {"gracePeriodSeconds": True},
        {"dryRun": ["All"]},
    ],
)
def test_bad_delete_options(options: Any) -> None:
    with pytest.raises(ApiError) as caught:
        params.parse_delete_options(options)
    assert caught.value.code == 400


def test_delete_options_preconditions() -> None:
    parsed = params.parse_delete_options({"preconditions": {"resourceVersion": "7", "uid": "u"}})
    assert parsed == params.DeleteOptions("7", "u")


@settings(max_examples=300, derandomize=True)
@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
    )
)
def test_checked_values_are_plain_or_400(value: Any) -> None:
    try:
        decode.check_value(value)
    except ApiError as exc:
        assert exc.code == 400


OLD = {"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"list": [1, 2]}}


def test_patch_formats() -> None:
    merged = patcher(MERGE, {"metadata": {"labels": {"x": None, "y": "2"}}})(OLD)
    assert merged["metadata"]["labels"] == {"y": "2"}
    strategic = patcher(STRATEGIC, {"spec": {"list": [3], "$retainKeys": ["list"]}})(OLD)
    assert strategic["spec"] == {"list": [3]}
    ops = [{"op": "add", "path": "/spec/list/-", "value": 3}]
    assert patcher(JSON_PATCH, ops)(OLD)["spec"]["list"] == [1, 2, 3]
    assert OLD["spec"]["list"] == [1, 2]  # the stored object is never modified


def test_json_patch_copy_bomb_is_refused() -> None:
    old = {"metadata": {"name": "a"}, "blob": "x" * 100_000}
    ops = [{"op": "copy", "from": "", "path": f"/c{i}"} for i in range(40)]
    with pytest.raises(ApiError) as caught:
        patcher(JSON_PATCH, ops)(old)
    assert caught.value.code == 413


def test_strategic_merge_merges_keyed_lists() -> None:
    old = {
        "metadata": {"name": "s"},
        "spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]},
    }
    patch = {
        "spec": {
            "ports": [{"port": 80, "targetPort": 8080}, {"port": 53, "name": "dns"}],
            "$setElementOrder/ports": [{"port": 53}, {"port": 80}, {"port": 443}],
        }
    }
    ports = patcher(STRATEGIC, patch)(old)["spec"]["ports"]
    assert ports == [
        {"port": 53, "name": "dns"},
        {"port": 80, "name": "http", "targetPort": 8080},
        {"port": 443, "name": "https"},
    ]
    gone = patcher(STRATEGIC, {"spec": {"ports": [{"port": 443, "$patch": "delete"}]}})(old)
    assert gone["spec"]["ports"] == [{"port": 80, "name": "http"}]
