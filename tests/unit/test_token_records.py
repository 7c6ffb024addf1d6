"""Token records in etcd (``podnet.api.tokenrecords``): keys, JSON values, bootstrap tokens,
ttl and node-name checks, and what a bootstrap token's user may do (nothing yet)."""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any

import pytest

from podnet.api.authorizer import (
    RequestAttributes,
    authorize,
    may_access_path,
    path_rules_for,
    rules_for,
)
from podnet.api.identity import User
from podnet.api.tokenrecords import (
    BOOTSTRAP_TOKEN,
    RecordError,
    TokenRecord,
    bootstrap_record,
    check_bootstrap_id,
    component_record,
    decode,
    digest,
    digest_of_key,
    encode,
    new_bootstrap_token,
    new_token,
    parse_ttl,
    token_key,
    usable,
)
from podnet.model.kinds import ALL_KINDS
from podnet.model.kinds import CERTIFICATE_SIGNING_REQUEST as CSR

T0 = datetime.datetime(2026, 12, 7, 12, 0, tzinfo=datetime.UTC)
TOKEN = "abcdef.0123456789abcdef"


def test_a_record_key_is_the_tokens_sha256_outside_the_object_keyspace() -> None:
    key = token_key("/podnet/registry/", digest("secret-token"))
    assert (
        key == "/podnet/registry/identities/tokens/" + hashlib.sha256(b"secret-token").hexdigest()
    )
    assert "secret-token" not in key
    assert digest_of_key("/podnet/registry/", key) == digest("secret-token")
    assert digest_of_key("/podnet/registry/", "/podnet/registry/identities/tokens/xyz") is None
    assert digest_of_key("/other/", key) is None
    from podnet.api.keyspace import KeySpace

    assert KeySpace("/podnet/registry/").parse_key(key) is None  # never an API object


def test_records_round_trip_and_hold_no_token() -> None:
    record = bootstrap_record(TOKEN, datetime.timedelta(hours=1), "node-1", "join", at=T0)
    raw = encode(record)
    assert TOKEN.encode() not in raw and b"0123456789abcdef" not in raw
    assert decode(raw) == record
    value = json.loads(raw)
    assert value["user"] == "system:bootstrap:abcdef"
    assert value["groups"] == ["system:bootstrappers"]
    assert value["expires"] == "2026-12-07T13:00:00Z" and value["usages"] == ["authentication"]
    assert value["node"] == "node-1"
    plain = component_record("system:node:n1", ["system:nodes"])
    assert decode(encode(plain)) == plain and "expires" not in json.loads(encode(plain))


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"user": "", "uid": "u", "created": "2026-12-07T12:00:00Z"}',
        b'{"user": "a", "uid": "u", "created": "yesterday"}',
        b'{"user": "a", "uid": "u", "created": "2026-12-07T12:00:00"}',
        b'{"user": "a", "uid": "u", "created": "2026-12-07T12:00:00Z", "groups": "g"}',
        b'{"user": "a", "uid": "u", "created": "2026-12-07T12:00:00Z", "node": "Bad_Node"}',
        b'{"user": "a", "uid": "u", "created": "2026-12-07T12:00:00Z", "admin": true}',
    ],
)
def test_records_that_are_not_exactly_one_are_refused(raw: bytes) -> None:
    with pytest.raises(RecordError):
        decode(raw)


def test_new_tokens_are_random_and_bootstrap_ones_have_kubeadms_format() -> None:
    assert len({new_token() for _ in range(50)}) == 50
    made = {new_bootstrap_token() for _ in range(50)}
    assert len(made) == 50 and all(BOOTSTRAP_TOKEN.fullmatch(t) for t in made)
    with pytest.raises(RecordError, match="bootstrap token"):
        bootstrap_record("ABCDEF.0123456789abcdef")


@pytest.mark.parametrize(
    ("text", "seconds"), [("24h", 86400), ("90s", 90), ("1h30m", 5400), ("7d", 604800)]
)
def test_ttl(text: str, seconds: int) -> None:
    assert parse_ttl(text).total_seconds() == seconds


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "bad ttl"),
        ("tomorrow", "bad ttl"),
        ("-1h", "bad ttl"),
        ("0s", "longer than 0s"),
        ("366d", "at most 365d"),
        ("1h 2m", "bad ttl"),
        ("5", "bad ttl"),
    ],
)
def test_bad_ttl(text: str, words: str) -> None:
    with pytest.raises(RecordError, match=words):
        parse_ttl(text)


def test_bad_node_names_and_ids_are_refused() -> None:
    with pytest.raises(RecordError, match="bad node name"):
        bootstrap_record(TOKEN, node="Node_1")
    with pytest.raises(RecordError, match="bad token id"):
        check_bootstrap_id("ABCDEF")


def test_expired_and_unusable_records() -> None:
    record = bootstrap_record(TOKEN, datetime.timedelta(minutes=1), at=T0)
    assert usable(record, T0 + datetime.timedelta(seconds=59))
    assert not usable(record, T0 + datetime.timedelta(minutes=1))
    no_usage = TokenRecord(record.user, record.groups, expires=record.expires)
    assert not usable(no_usage, T0)  # a bootstrap token must carry "authentication"
    assert usable(component_record("admin", ["system:masters"]))


def test_a_bootstrap_user_carries_its_node_and_other_users_none() -> None:
    user = bootstrap_record(TOKEN, node="node-1").identity()
    assert user == User("system:bootstrap:abcdef", ("system:bootstrappers",), "node-1")
    assert user.is_bootstrapper and user.node_name is None and not user.is_admin
    assert User("admin", ("system:masters",)).bound_node is None


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.plural)
@pytest.mark.parametrize("verb", ["get", "list", "watch", "create", "update", "delete"])
def test_a_bootstrap_token_may_only_ask_for_a_certificate(kind: Any, verb: str) -> None:
    """Create CertificateSigningRequests and read them (its own: the handlers check the
    object); nothing else, whatever other group its user name claims."""
    may = kind is CSR and verb in ("get", "list", "watch", "create")
    for user in (
        bootstrap_record(TOKEN).identity(),
        User("system:bootstrap:abcdef", ("system:nodes", "system:masters")),
    ):
        attrs = RequestAttributes(verb, kind, None, "x", None, {}, {})
        assert (authorize(user, attrs) is None) is may, (user, verb, kind.plural)


def test_a_bootstrap_token_reads_public_paths_not_metrics() -> None:
    user = bootstrap_record(TOKEN).identity()
    granted = {resource for rule in rules_for(user) for resource in rule.resources}
    reviews = {"selfsubjectaccessreviews", "selfsubjectrulesreviews"}
    assert granted - reviews == {"certificatesigningrequests"}, granted
    assert path_rules_for(user)
    for path in ("/api", "/apis", "/version"):
        assert may_access_path(user, "get", path)
    assert not may_access_path(user, "get", "/metrics")


def test_a_spent_bootstrap_token_keeps_a_short_grace_and_asks_for_nothing() -> None:
    import datetime as dt

    from podnet.api.csrrestriction import admit_create
    from podnet.api.tokenrecords import SPENT_GRACE, TokenRecord, decode, encode
    from podnet.model import errors as model_errors

    at = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)
    record = TokenRecord(
        "system:bootstrap:abcdef",
        ("system:bootstrappers",),
        expires=at + dt.timedelta(hours=24),
        node="n1",
    )
    spent = record.spend(at)
    assert spent.spent == at and spent.expires == at + SPENT_GRACE
    assert decode(encode(spent)) == spent  # stored and read back alike
    soon = TokenRecord("system:bootstrap:abcdef", ("system:bootstrappers",), node="n1")
    assert soon.spend(at).expires == at + SPENT_GRACE  # a token without expiry gets one
    early = record.spend(at + dt.timedelta(hours=23, minutes=58))
    assert early.expires == record.expires  # never later than it was
    assert not record.identity().spent and spent.identity().spent
    with pytest.raises(model_errors.ApiError) as refused:
        admit_create(spent.identity(), {"spec": {"request": ""}})
    assert refused.value.code == 403 and "used up" in str(refused.value)
