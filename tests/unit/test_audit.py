"""The master's audit log without a master: events of mocked requests, the file (0600,
rotation), and ``podnet master``'s audit flags."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from click.testing import CliRunner

from podnet.api.audit import MAX_FIELD, MIB, AuditLog, AuditOptions, event
from podnet.api.handlers import USER, VERB, json_response
from podnet.api.identity import User
from podnet.cli import master_cmd
from podnet.cli.main import CliState, cli

ADMIN = User("admin", ("system:masters", "system:authenticated"))
EVIL = 'x\n{"verb":"get"}\r\x1b[31m\x7f\x9b\u2028'


def request(
    method: str, tail: str, user: User | None = ADMIN, verb: str = "", agent: str = ""
) -> web.Request:
    headers = {"User-Agent": agent} if agent else {}
    path = f"/api/v1/{tail}"
    made = make_mocked_request(
        method, path, headers=headers, match_info={"version": "v1", "tail": tail}
    )
    if user is not None:
        made[USER] = user
    if verb:
        made[VERB] = verb
    return made


def test_event_names_who_what_and_the_code() -> None:
    made = request("DELETE", "namespaces/ns1/pods/p1", verb="delete", agent="kubectl")
    entry = event(made, 404, None)
    assert entry["verb"] == "delete"
    assert entry["user"] == {"username": "admin", "groups": list(ADMIN.groups)}
    assert entry["objectRef"] == {
        "resource": "pods",
        "namespace": "ns1",
        "name": "p1",
        "apiVersion": "v1",
    }
    assert entry["responseStatus"] == {"code": 404}
    assert entry["requestURI"] == "/api/v1/namespaces/ns1/pods/p1"
    assert entry["userAgent"] == "kubectl"


def test_a_create_is_named_by_the_created_object() -> None:
    created = json_response({"metadata": {"name": "gen-x7k2", "namespace": "ns1"}}, 201)
    entry = event(request("POST", "namespaces/ns1/pods", verb="create"), 201, created)
    assert entry["objectRef"]["name"] == "gen-x7k2"
    assert "name" not in event(request("POST", "namespaces/ns1/pods"), 409, None)["objectRef"]


def test_a_refused_request_still_says_what_it_tried() -> None:
    entry = event(request("DELETE", "namespaces/ns1/pods", user=None), 401, None)
    assert entry["user"] is None and entry["verb"] == "deletecollection"
    assert entry["objectRef"]["resource"] == "pods"
    bad = event(request("PATCH", "namespaces/ns1/nothings/a"), 404, None)
    assert bad["verb"] == "patch" and bad["objectRef"]["apiVersion"] == "v1"


def test_strings_are_bounded() -> None:
    entry = event(request("PUT", f"namespaces/ns1/pods/{'a' * 5000}"), 404, None)
    assert len(entry["objectRef"]["name"]) < MAX_FIELD + 20
    assert entry["objectRef"]["name"].endswith("...(truncated)")


def read_lines(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    for line in raw.split(b"\n")[:-1]:
        assert all(0x20 <= b < 0x7F for b in line), line
    return [json.loads(line) for line in raw.split(b"\n")[:-1]]


def test_the_file_holds_one_escaped_json_line_per_write(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "state" / "audit.log", MIB, 1)
    audit.record(request("DELETE", f"namespaces/ns1/pods/{EVIL}"), 404, None)
    audit.record(request("GET", "namespaces/ns1/pods/a"), 200, None)  # a read: no line
    audit.record(request("POST", "namespaces/ns1/pods", agent=EVIL), 403, None)
    audit.close()
    lines = read_lines(audit.path)
    assert [line["responseStatus"]["code"] for line in lines] == [404, 403]
    assert lines[0]["objectRef"]["name"] == EVIL and lines[1]["userAgent"] == EVIL
    assert stat.S_IMODE(audit.path.stat().st_mode) == 0o600


def test_the_file_rotates_at_its_bound_and_keeps_its_backups(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_text("")
    path.chmod(0o644)  # an older file: made private too
    audit = AuditLog(path, 2000, 2)
    for i in range(60):
        audit.record(request("DELETE", f"namespaces/ns1/pods/p{i}"), 404, None)
    audit.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["audit.log", "audit.log.1", "audit.log.2"]
    for name in files:
        assert (tmp_path / name).stat().st_size <= 2000
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    names = [line["objectRef"]["name"] for line in read_lines(path)]
    assert names[-1] == "p59"


def test_no_bound_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="size bound"):
        AuditLog(tmp_path / "audit.log", 0, 1)
    assert AuditLog.from_options(AuditOptions(enabled=False), tmp_path) is None


# ---- podnet master's flags -------------------------------------------------------------


def master_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *flags: str) -> Any:
    started: list[Any] = []

    async def runs(service: Any, logger: str) -> None:
        started.append(service.options)

    monkeypatch.setattr(master_cmd, "run_until_signalled", runs)
    monkeypatch.setattr(master_cmd, "log_to_stderr", lambda: None)
    argv = ["master", "--state-dir", str(tmp_path), *flags]
    result = CliRunner().invoke(cli, argv, obj=CliState())
    assert result.exit_code == 0 and started, result.output
    return started[0]


def test_the_audit_log_is_on_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    options = master_options(monkeypatch, tmp_path)
    assert options.audit == AuditOptions(True, None, 100 * MIB, 5)


def test_the_audit_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    flags = ["--audit-log", str(tmp_path / "a.log"), "--audit-log-max-size", "0.5"]
    options = master_options(monkeypatch, tmp_path, *flags, "--audit-log-max-backups", "3")
    assert options.audit == AuditOptions(True, tmp_path / "a.log", MIB // 2, 3)
    off = master_options(monkeypatch, tmp_path, "--no-audit-log")
    assert not off.audit.enabled


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--audit-log", "a.log", "--no-audit-log"], "not both"),
        (["--audit-log-max-size", "0"], "--audit-log-max-size"),
        (["--audit-log-max-backups", "0"], "--audit-log-max-backups"),
    ],
)
def test_bad_audit_flags_are_refused(tmp_path: Path, flags: list[str], words: str) -> None:
    result = CliRunner().invoke(cli, ["master", "--state-dir", str(tmp_path), *flags])
    assert result.exit_code != 0 and words in result.output, result.output


def test_a_path_no_route_matches_is_still_parsed() -> None:
    made = make_mocked_request("DELETE", "/apis/coordination.k8s.io/v1/namespaces/ns1/leases/a")
    ref = event(made, 404, None)["objectRef"]
    assert (ref["apiGroup"], ref["resource"], ref["namespace"], ref["name"]) == (
        "coordination.k8s.io",
        "leases",
        "ns1",
        "a",
    )
    assert event(make_mocked_request("POST", "/healthz"), 405, None)["objectRef"] == {}
