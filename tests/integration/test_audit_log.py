"""The master's audit log, through a real ``podnet master``: one JSON line per write (not
per read) with the right user and code, lines no name or header can forge, rotation at
``--audit-log-max-size``, and ``--log-format json`` on the master's own log."""

from __future__ import annotations

import json
import socket
import ssl
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from podnet.api.auth import ensure_node_token
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for, kubeconfig_parts
from podnet.testing.processes import MasterProcess, launch_master

LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
MERGE = {"Content-Type": "application/merge-patch+json"}
MAX_BYTES = int(0.01 * 1024 * 1024)
EVIL = 'x\n{"verb":"delete","user":{"username":"admin"}}\r\x1b[2J\x1b]0;owned\x07\u2028'


def lease(name: str) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}}


@pytest.fixture
def audited(etcd: EtcdProcess, tmp_path: Path, prefix: str) -> Iterator[MasterProcess]:
    flags = ["--audit-log-max-size", "0.01", "--audit-log-max-backups", "2"]
    process = launch_master(etcd, tmp_path / "master", prefix, *flags, "--log-format", "json")
    try:
        yield process
    finally:
        process.stop()


def audit_lines(master: MasterProcess) -> list[dict[str, Any]]:
    """Every line of the audit log and its backups, oldest first; each must be one JSON
    object of printable ASCII (no raw newline, carriage return or escape)."""
    entries = []
    for name in ("audit.log.2", "audit.log.1", "audit.log"):
        path = master.state_dir / name
        if not path.exists():
            continue
        raw = path.read_bytes()
        assert raw.endswith(b"\n"), raw[-200:]
        for line in raw.split(b"\n")[:-1]:
            assert all(0x20 <= b < 0x7F for b in line), line
            entry = json.loads(line)
            assert isinstance(entry, dict)
            entries.append(entry)
    return entries


def summary(entry: dict[str, Any]) -> tuple[Any, ...]:
    user = entry["user"]["username"] if entry["user"] else None
    ref = entry["objectRef"]
    return entry["verb"], user, ref["resource"], ref.get("name"), entry["responseStatus"]["code"]


def test_writes_are_audited_with_user_and_code(audited: MasterProcess) -> None:
    with client_for(audited.kubeconfig) as admin:
        assert admin.post(LEASES, json=lease("a")).status_code == 201
        assert admin.post(LEASES, json=lease("a")).status_code == 409
        current = admin.get(f"{LEASES}/a")
        assert current.status_code == 200
        assert admin.get(LEASES).status_code == 200
        body = current.json()
        body["spec"] = {"holderIdentity": "me"}
        assert admin.put(f"{LEASES}/a", json=body).status_code == 200
        patch = {"spec": {"holderIdentity": "you"}}
        assert admin.patch(f"{LEASES}/a", json=patch, headers=MERGE).status_code == 200
        assert admin.delete(f"{LEASES}/a").status_code == 200
        assert admin.delete(f"{LEASES}/a").status_code == 404
    token = ensure_node_token(audited.state_dir / "tokens.csv", "n1")
    with client_for(audited.kubeconfig, token=token) as node:
        assert node.post("/api/v1/namespaces", json={"metadata": {"name": "x"}}).status_code == 403
    with client_for(audited.kubeconfig, token=None) as nobody:
        assert nobody.post(LEASES, json=lease("b")).status_code == 401
    entries = audit_lines(audited)
    assert [summary(e) for e in entries] == [
        ("create", "admin", "leases", "a", 201),
        ("create", "admin", "leases", None, 409),
        ("update", "admin", "leases", "a", 200),
        ("patch", "admin", "leases", "a", 200),
        ("delete", "admin", "leases", "a", 200),
        ("delete", "admin", "leases", "a", 404),
        ("create", "system:node:n1", "namespaces", None, 403),
        ("create", None, "leases", None, 401),
    ]
    assert "system:masters" in entries[0]["user"]["groups"]
    assert entries[0]["objectRef"]["namespace"] == "default"
    assert entries[0]["sourceIPs"] == ["127.0.0.1"]
    assert stat.S_IMODE((audited.state_dir / "audit.log").stat().st_mode) == 0o600
    # --log-format json: the master's own log is JSON lines too
    logged = [json.loads(line) for line in audited.log_path.read_text().splitlines() if line]
    assert any(e["message"].startswith("API server listening") for e in logged)


def raw_request(master: MasterProcess, head: bytes, body: bytes = b"") -> int:
    """Send one HTTP request as bytes over TLS (no client library to clean it up)."""
    _, ca, token = kubeconfig_parts(master.kubeconfig)
    context = ssl.create_default_context(cadata=ca.decode())
    request = (
        head
        + (
            f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body
    )
    with (
        socket.create_connection(("127.0.0.1", master.port), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(request)
        answer = b""
        while b"\r\n" not in answer:
            chunk = tls.recv(4096)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ")[1])


def test_audit_lines_cannot_be_forged(audited: MasterProcess) -> None:
    named, bad_name = json.dumps(lease("fine")).encode(), json.dumps(lease(EVIL)).encode()
    codes = [
        raw_request(audited, f"DELETE {LEASES}/{quote(EVIL, safe='')} HTTP/1.1\r\n".encode()),
        raw_request(
            audited,
            f"POST /apis/coordination.k8s.io/v1/namespaces/{quote(EVIL, safe='')}/leases "
            "HTTP/1.1\r\n".encode(),
            named,
        ),
        raw_request(audited, f"PUT {LEASES}/{'n' * 5000} HTTP/1.1\r\n".encode(), named),
        raw_request(audited, f"POST {LEASES} HTTP/1.1\r\n".encode(), bad_name),
        raw_request(
            audited,
            f"POST {LEASES} HTTP/1.1\r\nUser-Agent: ua\u2028\u009b31m\u00e9\r\n".encode(),
            json.dumps(lease("ua")).encode(),
        ),
    ]
    assert codes[0] == 404 and codes[3] in (400, 422) and codes[4] == 201, codes
    entries = audit_lines(audited)  # each line: one JSON object, no raw control character
    assert len(entries) == 5
    assert all(e["user"]["username"] == "admin" for e in entries)
    by_code = {summary(e)[4]: e for e in entries}
    deleted = entries[0]["objectRef"]  # no route matches a newline: the path is parsed
    assert (entries[0]["verb"], deleted["resource"], deleted["name"]) == ("delete", "leases", EVIL)
    assert entries[1]["objectRef"]["namespace"] == EVIL
    long_name = [e["objectRef"]["name"] for e in entries if e["verb"] == "update"]
    assert long_name and len(long_name[0]) < 600 and long_name[0].endswith("(truncated)")
    assert by_code[201]["userAgent"] == "ua\u2028\u009b31m\u00e9"


def test_the_audit_log_rotates_at_its_bound(audited: MasterProcess) -> None:
    with client_for(audited.kubeconfig) as admin:
        for i in range(120):
            created = admin.post(LEASES, json=lease(f"lease-{i:03d}-{'x' * 40}"))
            assert created.status_code == 201
        assert admin.get(LEASES).status_code == 200
    names = sorted(p.name for p in audited.state_dir.glob("audit.log*"))
    assert names == ["audit.log", "audit.log.1", "audit.log.2"]
    for name in names:
        path = audited.state_dir / name
        assert path.stat().st_size <= MAX_BYTES
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    kept = [e["objectRef"]["name"] for e in audit_lines(audited)]
    assert 30 < len(kept) < 120  # the oldest went with the third rotation
    assert kept == sorted(kept) and kept[-1].startswith("lease-119-")
