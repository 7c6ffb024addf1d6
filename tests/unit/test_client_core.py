"""podnet.client's core: the error tree, the backoff (on a fake clock), watch-line
decoding, resource paths and versions."""

from __future__ import annotations

import asyncio
import json

import pytest

from podnet.client import (
    ADDED,
    BOOKMARK,
    AlreadyExists,
    Attempts,
    Backoff,
    ClientError,
    Conflict,
    EventType,
    Expired,
    InvalidResponse,
    NotFound,
    ServerError,
    StatusError,
    TLSFailure,
    Unreachable,
    WatchEvent,
    error_from_body,
    error_from_status,
    has_reason,
    is_transient,
    resource_path,
    resource_version,
    with_retry,
)
from podnet.client.watch import decode_event, listed
from podnet.model import errors as model_errors
from podnet.model.kinds import LEASE, NODE, POD

# ---- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason", "cls", "transient"),
    [
        (404, "NotFound", NotFound, False),
        (409, "AlreadyExists", AlreadyExists, False),
        (409, "Conflict", Conflict, False),
        (410, "Expired", Expired, False),
        (410, "Gone", Expired, False),
        (410, "", Expired, False),
        (403, "Forbidden", StatusError, False),
        (422, "Invalid", StatusError, False),
        (429, "TooManyRequests", ServerError, True),
        (500, "InternalError", ServerError, True),
        (503, "ServiceUnavailable", ServerError, True),
        (504, "Timeout", ServerError, True),
    ],
)
def test_error_from_status_picks_the_class(
    code: int, reason: str, cls: type[StatusError], transient: bool
) -> None:
    err = error_from_status("why", code, reason)
    assert type(err) is cls
    assert is_transient(err) is transient
    assert (err.code, err.message) == (code, "why")
    assert err.reason == (reason or "Expired")


def test_model_errors_translate_into_the_same_tree() -> None:
    for model, cls in [
        (model_errors.not_found("pods", "p"), NotFound),
        (model_errors.already_exists("pods", "p"), AlreadyExists),
        (model_errors.conflict("pods", "p", "stale"), Conflict),
        (model_errors.gone("too old"), Expired),
        (model_errors.unavailable("etcd down"), ServerError),
        (model_errors.forbidden("no"), StatusError),
    ]:
        err = error_from_status(model.message, model.code, model.reason)
        assert type(err) is cls
        assert (err.code, err.reason, err.message) == (model.code, model.reason, model.message)


def test_error_from_body_reads_a_status_or_falls_back_to_the_code() -> None:
    status = model_errors.not_found("nodes", "n1").status()
    err = error_from_body(404, json.dumps(status).encode())
    assert isinstance(err, NotFound)
    assert err.details == {"name": "n1", "kind": "nodes"}
    plain = error_from_body(502, b"bad\ngateway")
    assert (type(plain), plain.reason, plain.message) == (ServerError, "Unknown", "bad gateway")
    empty = error_from_body(401, b"", "Unauthorized")
    assert (empty.reason, empty.message) == ("Unauthorized", "Unauthorized")


def test_transient_is_explicit() -> None:
    assert is_transient(Unreachable("https://m", "refused"))
    assert not is_transient(TLSFailure("https://m", "unknown CA"))
    assert is_transient(InvalidResponse("not JSON", 200))
    assert is_transient(TimeoutError()) and is_transient(ConnectionResetError())
    assert not is_transient(ValueError("x"))
    assert not is_transient(ClientError("config"))
    assert has_reason(Conflict("stale", 409, "Conflict"), "Conflict", "AlreadyExists")
    assert not has_reason(ValueError(), "Conflict")


# ---- backoff ----------------------------------------------------------------------------


def test_backoff_grows_caps_and_jitters_within_its_floor() -> None:
    low, high = Backoff(0.1, 1.0, floor=0.5, rand=lambda: 0.0), Backoff(0.1, 1.0, rand=lambda: 1.0)
    assert [high.delay(n) for n in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert [low.delay(n) for n in range(3)] == pytest.approx([0.05, 0.1, 0.2])
    full = Backoff(0.2, 1.0, floor=0.0, rand=lambda: 0.0)
    assert full.delay(5) == 0.0
    assert high.delay(10_000) == 1.0  # no overflow for a long outage


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_attempts_stop_before_the_deadline() -> None:
    clock = FakeClock()
    attempts = Attempts(Backoff(1.0, 8.0, rand=lambda: 1.0), 10.0, clock.time)
    delays = []
    while (delay := attempts.next_delay()) is not None:
        delays.append(delay)
        clock.now += delay
    assert delays == [1.0, 2.0, 4.0]  # the next (8 s) would end at 115 > 110
    attempts.reset()
    assert attempts.attempt == 0
    forever = Attempts(Backoff(1.0, 2.0, rand=lambda: 1.0), None, clock.time)
    clock.now += 1e9
    assert [forever.next_delay() for _ in range(4)] == [1.0, 2.0, 2.0, 2.0]


async def test_with_retry_retries_transient_errors_on_a_fake_clock() -> None:
    clock = FakeClock()
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise ServerError("etcd down", 503, "ServiceUnavailable")
        return "ok"

    backoff = Backoff(1.0, 4.0, rand=lambda: 1.0)
    got = await with_retry(flaky, "flaky", 60.0, backoff, sleep=clock.sleep, clock=clock.time)
    assert got == "ok"
    assert clock.slept == [1.0, 2.0, 4.0]


async def test_with_retry_gives_up_at_the_deadline_and_never_retries_permanent() -> None:
    clock = FakeClock()
    calls: list[int] = []

    async def down() -> None:
        calls.append(1)
        raise Unreachable("https://m", "refused")

    backoff = Backoff(1.0, 4.0, rand=lambda: 1.0)
    with pytest.raises(Unreachable):
        await with_retry(down, "down", 6.0, backoff, sleep=clock.sleep, clock=clock.time)
    assert clock.slept == [1.0, 2.0]  # then 4 s would pass the 6 s deadline
    assert len(calls) == 3

    async def refused() -> None:
        calls.append(1)
        raise NotFound("gone", 404, "NotFound")

    calls.clear()
    with pytest.raises(NotFound):
        await with_retry(refused, "refused", None, backoff, sleep=clock.sleep, clock=clock.time)
    assert len(calls) == 1
    conflicts = iter([Conflict("stale", 409, "Conflict"), None])

    async def once_stale() -> str:
        err = next(conflicts)
        if err is not None:
            raise err
        return "written"

    retry_conflicts = lambda exc: is_transient(exc) or has_reason(exc, "Conflict")  # noqa: E731
    got = await with_retry(
        once_stale, "write", 5.0, backoff, retry_conflicts, sleep=clock.sleep, clock=clock.time
    )
    assert got == "written"


async def test_with_retry_bounds_each_try_with_a_timeout() -> None:
    calls: list[int] = []
    never = asyncio.Event()

    async def hangs_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            await never.wait()
        return "answered"

    backoff = Backoff(0.0, 0.0)
    assert await with_retry(hangs_once, "hang", 5.0, backoff, timeout=0.01) == "answered"
    assert len(calls) == 2


# ---- watch vocabulary, versions, paths -----------------------------------------------------


def test_decode_event_lines() -> None:
    line = json.dumps({"type": "ADDED", "object": {"metadata": {"resourceVersion": "7"}}})
    event = decode_event(line.encode())
    assert event == WatchEvent(ADDED, {"metadata": {"resourceVersion": "7"}})
    assert event.type is EventType.ADDED and event.resource_version == 7
    mark = decode_event('{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}')
    assert (mark.type, mark.resource_version) == (BOOKMARK, 9)
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    with pytest.raises(Expired, match="too old"):
        decode_event(json.dumps(gone))
    for bad in (b"not json", b"[]", b'{"type": "ADDED"}', b'{"type": "WHAT", "object": {}}'):
        with pytest.raises(InvalidResponse):
            decode_event(bad)


def test_listed_carries_the_items_and_the_listing_version() -> None:
    event = listed(({"metadata": {"name": "a"}},), 42)
    assert event.type == "LISTED" and event.resource_version == 42
    assert event.object == {"metadata": {"resourceVersion": "42"}}
    assert [o["metadata"]["name"] for o in event.items] == ["a"]


def test_resource_version_is_an_int() -> None:
    assert resource_version({"metadata": {"resourceVersion": "12"}}) == 12
    assert resource_version({"metadata": {}}) == 0
    assert resource_version({}) == 0
    assert resource_version({"metadata": {"resourceVersion": "opaque"}}) == 0


def test_resource_path_subresources() -> None:
    assert resource_path(NODE, None, "n1", "status") == "/api/v1/nodes/n1/status"
    assert resource_path(POD, "shop", "web", "status") == "/api/v1/namespaces/shop/pods/web/status"
    lease = resource_path(LEASE, "kube-node-lease", "n1")
    assert lease == "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1"
