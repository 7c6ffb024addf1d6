"""Label and field selectors: parsing, matching, errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from podnet.model.selectors import (
    FieldRequirement,
    LabelSelector,
    field_value,
    fields_match,
    label_selector_from_spec,
    parse_field_selector,
    parse_label_selector,
)

WEB = {"app": "web", "tier": "front", "env": "prod"}


# --- label selector strings -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("", WEB, True),
        ("", None, True),
        ("app=web", WEB, True),
        ("app==web", WEB, True),
        ("app=db", WEB, False),
        ("app!=db", WEB, True),
        ("app!=web", WEB, False),
        ("missing!=x", WEB, True),
        ("tier in (front, back)", WEB, True),
        ("tier in (back)", WEB, False),
        ("tier notin (back)", WEB, True),
        ("missing notin (x)", WEB, True),
        ("missing in (x)", WEB, False),
        ("app", WEB, True),
        ("missing", WEB, False),
        ("!missing", WEB, True),
        ("!app", WEB, False),
        ("app=web,env=prod", WEB, True),
        ("app=web,env=dev", WEB, False),
        ("  app = web ,  !canary ", WEB, True),
        ("example.com/role=db", {"example.com/role": "db"}, True),
        ("empty=", {"empty": ""}, True),
        ("empty=", {}, False),
        ("n>3", {"n": "5"}, True),
        ("n<3", {"n": "5"}, False),
        ("n>3", {"n": "five"}, False),
        ("n>3", {}, False),
        ("app=web", None, False),
    ],
)
def test_parse_and_match(text: str, labels: dict[str, str] | None, expected: bool) -> None:
    assert parse_label_selector(text).matches(labels) is expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("app=", None),
        ("app in ()", "at least one value"),
        ("app in (a", "expected ','"),
        ("app in a", "expected '('"),
        ("app=web,", "a requirement after ','"),
        ("=web", "expected a label key"),
        ("app web", "expected one of"),
        ("!app=web", "expected ','"),
        ("Bad Key=x", "expected one of"),
        ("-bad=x", "invalid label key '-bad'"),
        ("app=" + "v" * 64, "invalid label value"),
        ("n>x", "not an integer"),
        ("app=(x)", "expected a label value"),
    ],
)
def test_bad_syntax_is_a_clear_value_error(text: str, fragment: str | None) -> None:
    if fragment is None:  # "app=" is valid: an empty value
        assert parse_label_selector(text).matches({"app": ""})
        return
    with pytest.raises(ValueError) as info:
        parse_label_selector(text)
    assert fragment in str(info.value)


def test_selector_is_immutable_hashable_and_order_insensitive() -> None:
    a = parse_label_selector("app=web,tier in (b,a)")
    b = parse_label_selector("tier in (a,b), app==web")
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.requirements = ()  # type: ignore[misc]


def test_is_empty_and_str() -> None:
    assert parse_label_selector("").is_empty()
    assert LabelSelector().is_empty()
    sel = parse_label_selector("b in (y,x),a=1,!c,d,e!=2,f notin (z)")
    assert not sel.is_empty()
    assert str(sel) == "a=1,b in (x,y),!c,d,e!=2,f!=z"
    assert parse_label_selector(str(sel)) == sel


# --- object form ----------------------------------------------------------------------------


def test_from_spec_match_labels_and_expressions() -> None:
    spec = {
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["front", "back"]},
            {"key": "canary", "operator": "DoesNotExist"},
            {"key": "env", "operator": "Exists"},
            {"key": "zone", "operator": "NotIn", "values": ["b"]},
        ],
    }
    sel = label_selector_from_spec(spec)
    assert sel.matches(WEB)
    assert not sel.matches({**WEB, "canary": "yes"})
    assert not sel.matches({**WEB, "zone": "b"})
    assert not sel.matches({"app": "web"})


def test_from_spec_empty_and_none_select_everything() -> None:
    assert label_selector_from_spec({}).matches({})
    assert label_selector_from_spec({}).is_empty()
    assert label_selector_from_spec(None).is_empty()
    assert label_selector_from_spec({"matchLabels": None}).matches(WEB)


@pytest.mark.parametrize(
    "spec",
    [
        {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["x"]}]},
        {"matchExpressions": [{"key": "a", "operator": "In"}]},
        {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
        {"matchLabels": {"bad key": "x"}},
    ],
)
def test_from_spec_errors(spec: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        label_selector_from_spec(spec)


label_values = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,5}[a-z0-9])?", fullmatch=True)
label_maps = st.dictionaries(st.sampled_from(["app", "tier", "env", "a.io/x"]), label_values)


@given(selector=label_maps, labels=label_maps)
def test_match_labels_string_and_object_forms_agree(
    selector: dict[str, str], labels: dict[str, str]
) -> None:
    text = ",".join(f"{k}={v}" for k, v in selector.items())
    from_text = parse_label_selector(text)
    assert from_text == label_selector_from_spec({"matchLabels": selector})
    expected = all(labels.get(k) == v for k, v in selector.items())
    assert from_text.matches(labels) is expected
    assert from_text.matches({**labels, **selector})


# --- field selectors ------------------------------------------------------------------------

ALLOWED = {"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"}
POD = {
    "metadata": {"name": "web-1", "namespace": "shop"},
    "spec": {"nodeName": "node-1", "priority": 5, "hostNetwork": False},
    "status": {"phase": "Running"},
}


def test_parse_field_selector() -> None:
    reqs = parse_field_selector("metadata.name=web-1, spec.nodeName!=node-2", ALLOWED)
    assert reqs == [
        FieldRequirement("metadata.name", "=", "web-1"),
        FieldRequirement("spec.nodeName", "!=", "node-2"),
    ]
    assert parse_field_selector("status.phase==Running", ALLOWED) == [
        FieldRequirement("status.phase", "=", "Running")
    ]
    assert parse_field_selector("", ALLOWED) == []
    assert parse_field_selector("spec.nodeName=", ALLOWED) == [
        FieldRequirement("spec.nodeName", "=", "")
    ]


def test_field_selector_escapes() -> None:
    reqs = parse_field_selector(r"metadata.name=a\,b\=c\\d,status.phase=x", ALLOWED)
    assert reqs[0] == FieldRequirement("metadata.name", "=", "a,b=c\\d")
    assert reqs[1].value == "x"


def test_field_selector_errors() -> None:
    with pytest.raises(ValueError, match=r"field label not supported: spec\.priority"):
        parse_field_selector("spec.priority=5", ALLOWED)
    with pytest.raises(ValueError, match="expected <field>=<value>"):
        parse_field_selector("metadata.name", ALLOWED)


def test_field_value_and_match() -> None:
    assert field_value(POD, "spec.nodeName") == "node-1"
    assert field_value(POD, "spec.priority") == "5"
    assert field_value(POD, "spec.hostNetwork") == "false"
    assert field_value(POD, "spec.missing") == ""
    assert field_value(POD, "metadata.name.deeper") == ""
    assert field_value(POD, "metadata") == ""
    assert fields_match(
        POD, parse_field_selector("metadata.name=web-1,status.phase=Running", ALLOWED)
    )
    assert not fields_match(POD, parse_field_selector("spec.nodeName!=node-1", ALLOWED))
    unscheduled = {"metadata": {"name": "p"}, "spec": {}}
    assert fields_match(unscheduled, parse_field_selector("spec.nodeName=", ALLOWED))
    assert fields_match(POD, [])
