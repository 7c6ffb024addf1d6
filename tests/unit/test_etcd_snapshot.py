"""The pure parts of ``podnet.store.etcd_snapshot`` and of node credential revocation:
etcdctl's environment and command lines (no secret on a command line), the restore
plan's checks, and token rows removed under ``add_token``'s lock."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import pytest

from podnet.store import etcd_snapshot
from podnet.store.etcd_pki import EtcdTls
from podnet.store.etcd_snapshot import (
    RestorePlan,
    SnapshotError,
    check_plan,
    etcdctl_env,
    restore_argv,
    why,
)

PAGES = bytes(range(256)) * 4  # two 512-byte "pages"
TLS = EtcdTls(Path("/pki/ca.crt"), Path("/pki/client.crt"), Path("/pki/client.key"))


def test_etcdctl_env_drops_the_callers_etcdctl_settings() -> None:
    base = {"PATH": "/usr/bin", "ETCDCTL_USER": "root:secret", "ETCDCTL_ENDPOINTS": "x:1"}
    env = etcdctl_env(base, "127.0.0.1:2379", TLS)
    assert "ETCDCTL_USER" not in env
    assert env["ETCDCTL_ENDPOINTS"] == "https://127.0.0.1:2379"
    assert env["ETCDCTL_KEY"] == "/pki/client.key" and env["ETCDCTL_API"] == "3"
    assert etcdctl_env(base, "127.0.0.1:2379")["ETCDCTL_ENDPOINTS"] == "http://127.0.0.1:2379"


def test_save_passes_no_tls_or_endpoint_on_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[list[str], dict[str, str]]] = []

    def fake_run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen.append((argv, kwargs["env"]))
        if argv[1:3] == ["snapshot", "save"]:
            Path(argv[3]).write_bytes(PAGES + hashlib.sha256(PAGES).digest())
        out = '{"hash":1,"revision":2,"totalKey":3,"totalSize":4}' if "status" in argv else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(etcd_snapshot, "_etcdctl", lambda: "/usr/bin/etcdctl")
    monkeypatch.setattr(etcd_snapshot.subprocess, "run", fake_run)
    found = etcd_snapshot.save(["127.0.0.1:2379"], TLS, tmp_path / "out.db")
    assert found.total_keys == 3
    assert (tmp_path / "out.db").stat().st_mode & 0o777 == 0o600
    for argv, _env in seen:
        assert not any("pki" in a or "2379" in a for a in argv), argv
    assert any(env.get("ETCDCTL_CERT") == "/pki/client.crt" for _, env in seen)


def test_restore_argv_names_the_member() -> None:
    plan = RestorePlan(Path("/var/lib/etcd/new"), "etcd1", ("https://10.0.0.1:2380",))
    argv = restore_argv(Path("/b/etcd.db"), Path("/var/lib/etcd/.x/data"), plan)
    assert argv[1:4] == ["snapshot", "restore", "/b/etcd.db"]
    assert argv[argv.index("--initial-cluster") + 1] == "etcd1=https://10.0.0.1:2380"
    assert argv[argv.index("--initial-cluster-token") + 1] == "podnet"
    assert argv[argv.index("--data-dir") + 1] == "/var/lib/etcd/.x/data"


@pytest.mark.parametrize(
    ("name", "urls", "cluster", "wanted"),
    [
        ("", ("https://a:2380",), "", "--name"),
        ("etcd 1", ("https://a:2380",), "", "--name"),
        ("etcd1", (), "", "peer URL"),
        ("etcd1", ("a:2380",), "", "http(s)://host:port"),
        ("etcd1", ("https://a",), "", "http(s)://host:port"),
        ("etcd1", ("https://a:2380/x",), "", "http(s)://host:port"),
        ("etcd1", ("https://a:2380",), "etcd2=https://b:2380", "must list etcd1"),
        ("etcd1", ("https://a:2380",), "etcd1=https://c:2380", "must list etcd1"),
        ("etcd1", ("https://a:2380",), "etcd1", "name=peer-url"),
    ],
)
def test_plans_etcd_would_refuse_are_refused(
    name: str, urls: tuple[str, ...], cluster: str, wanted: str
) -> None:
    with pytest.raises(SnapshotError) as caught:
        check_plan(RestorePlan(Path("/d"), name, urls, cluster))
    assert wanted in str(caught.value)


def test_a_three_member_plan_is_accepted() -> None:
    cluster = "etcd1=https://a:2380,etcd2=https://b:2380,etcd3=https://c:2380"
    check_plan(RestorePlan(Path("/d"), "etcd2", ("https://b:2380",), cluster))


def test_why_prefers_etcdctls_error_line() -> None:
    assert why('{"level":"info"}\nError: snapshot file integrity check failed\n') == (
        "snapshot file integrity check failed"
    )
    assert why("") == "no reason given"


def test_integrity_hash_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(PAGES + hashlib.sha256(PAGES).digest())
    assert etcd_snapshot.integrity_problem(path) is None
    path.write_bytes(PAGES[:-1] + b"x" + hashlib.sha256(PAGES).digest())
    assert "does not match" in str(etcd_snapshot.integrity_problem(path))
    path.write_bytes(PAGES)  # a bare database (copied from a data dir): no hash
    assert "no integrity hash" in str(etcd_snapshot.integrity_problem(path))
    path.write_bytes(b"")
    assert "no integrity hash" in str(etcd_snapshot.integrity_problem(path))
