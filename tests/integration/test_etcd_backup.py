"""``podnet adm backup`` and ``podnet adm restore`` against a real TLS etcd (issue 20).

A backup taken with the master's etcd flags, then more writes, then a restore into a new
data directory: an etcd started on it (other loopback ports) holds the backup's data and
none of the later writes. The snapshot file is 0600; a restore refuses an existing
directory, a missing file and a corrupt snapshot, and changes nothing when it refuses.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from podnet.cluster.state import ClusterState, EtcdMemberRecord
from podnet.store.etcd_pki import EtcdPki, EtcdTls, ensure_etcd_pki
from podnet.store.etcd_process import EtcdProcess, free_port, wait_healthy
from podnet.testing import tools

MEMBER = "etcd1"


@dataclass
class Cluster:
    etcd: EtcdProcess
    pki: EtcdPki

    @property
    def tls(self) -> EtcdTls:
        return self.pki.client_tls()


def etcdctl(tls: EtcdTls, endpoint: str, *args: str) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "ETCDCTL_API": "3",
        "ETCDCTL_ENDPOINTS": f"https://{endpoint}",
        "ETCDCTL_CACERT": str(tls.ca),
        "ETCDCTL_CERT": str(tls.cert),
        "ETCDCTL_KEY": str(tls.key),
    }
    done = subprocess.run(
        [tools.require("etcdctl"), *args], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def value(cluster: Cluster, key: str) -> str | None:
    out = etcdctl(cluster.tls, cluster.etcd.endpoint, "get", key, "--print-value-only")
    return out.rstrip("\n") if out else None


def podnet(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PODNET_STATE_DIR": str(cwd / "no-cluster")}
    return subprocess.run(
        [sys.executable, "-m", "podnet", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def start_member(data_dir: Path, pki: EtcdPki) -> EtcdProcess:
    peer = free_port()
    member = EtcdProcess(data_dir, free_port(), peer, name=MEMBER, pki=pki)
    member.initial_cluster = f"{MEMBER}={member.peer_url}"
    member.start(timeout=20)
    wait_healthy(member.client_url, pki.client_tls(), timeout=20)
    return member


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    tools.require("etcd")
    tools.require("etcdctl")
    pki = EtcdPki(tmp_path / "etcd-pki")
    ensure_etcd_pki(pki.directory, {MEMBER: []})
    member = start_member(tmp_path / "member", pki)
    try:
        yield Cluster(member, pki)
    finally:
        member.stop()


def backup(cluster: Cluster, output: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    tls = cluster.tls
    return podnet(
        *("adm", "backup", "-o", str(output), "--etcd", cluster.etcd.endpoint),
        *("--etcd-cafile", str(tls.ca), "--etcd-certfile", str(tls.cert)),
        *("--etcd-keyfile", str(tls.key)),
        cwd=cwd,
    )


def restore(
    snapshot: Path, data_dir: Path, peer: str, cwd: Path
) -> subprocess.CompletedProcess[str]:
    return podnet(
        *("adm", "restore", str(snapshot), "--data-dir", str(data_dir), "--name", MEMBER),
        *("--initial-advertise-peer-urls", peer),
        cwd=cwd,
    )


def test_backup_then_restore_gives_the_backups_data(cluster: Cluster, tmp_path: Path) -> None:
    etcdctl(cluster.tls, cluster.etcd.endpoint, "put", "/podnet/registry/kept", "before")
    etcdctl(cluster.tls, cluster.etcd.endpoint, "put", "/podnet/registry/changed", "old")
    snapshot = tmp_path / "backups" / "etcd.db"
    snapshot.parent.mkdir()
    done = backup(cluster, snapshot, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and "keys" in done.stdout
    assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600
    assert os.listdir(snapshot.parent) == ["etcd.db"]  # no temporary left behind

    etcdctl(cluster.tls, cluster.etcd.endpoint, "put", "/podnet/registry/changed", "new")
    etcdctl(cluster.tls, cluster.etcd.endpoint, "put", "/podnet/registry/later", "after")

    # EtcdProcess runs etcd on <dir>/etcd: restore straight there.
    restored_root = tmp_path / "restored"
    restored_root.mkdir()
    peer = free_port()
    done = restore(snapshot, restored_root / "etcd", f"https://127.0.0.1:{peer}", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "next steps" in done.stdout
    assert stat.S_IMODE((restored_root / "etcd").stat().st_mode) == 0o700
    assert sorted(os.listdir(restored_root)) == ["etcd"]

    member = EtcdProcess(restored_root, free_port(), peer, name=MEMBER, pki=cluster.pki)
    member.initial_cluster = f"{MEMBER}={member.peer_url}"
    member.start(timeout=20)
    try:
        wait_healthy(member.client_url, cluster.tls, timeout=20)
        again = Cluster(member, cluster.pki)
        assert value(again, "/podnet/registry/kept") == "before"
        assert value(again, "/podnet/registry/changed") == "old"
        assert value(again, "/podnet/registry/later") is None
    finally:
        member.stop()


def test_backup_failure_keeps_the_old_file(cluster: Cluster, tmp_path: Path) -> None:
    snapshot = tmp_path / "etcd.db"
    snapshot.write_bytes(b"an older backup")
    done = podnet(
        *("adm", "backup", "-o", str(snapshot), "--etcd", f"127.0.0.1:{free_port()}"),
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "backup failed" in done.stderr and "unchanged" in done.stderr
    assert snapshot.read_bytes() == b"an older backup"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".etcd.db")) == []


@pytest.fixture
def snapshot(cluster: Cluster, tmp_path: Path) -> Path:
    etcdctl(cluster.tls, cluster.etcd.endpoint, "put", "/podnet/registry/k", "v" * 4096)
    path = tmp_path / "good.db"
    done = backup(cluster, path, tmp_path)
    assert done.returncode == 0, done.stderr
    return path


def test_restore_refuses_an_existing_directory(snapshot: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "existing"
    data_dir.mkdir()
    (data_dir / "member").write_text("the live member's data")
    done = restore(snapshot, data_dir, "https://127.0.0.1:2380", tmp_path)
    assert done.returncode == 1
    assert "refusing to restore" in done.stderr and "not empty" in done.stderr
    assert os.listdir(data_dir) == ["member"]
    assert (data_dir / "member").read_text() == "the live member's data"
    assert not [p for p in tmp_path.iterdir() if ".restore-" in p.name]


def test_restore_refuses_missing_and_corrupt_snapshots(snapshot: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(os.urandom(64 * 1024))
    flipped = tmp_path / "flipped.db"
    data = bytearray(snapshot.read_bytes())
    at = data.index(b"v" * 4096) + 100  # inside a value: the database still opens
    data[at] ^= 0xFF
    flipped.write_bytes(bytes(data))
    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(snapshot.read_bytes()[: len(data) // 2])
    cases = {
        tmp_path / "missing.db": "no such snapshot file",
        garbage: "not a usable etcd snapshot",
        flipped: "integrity hash does not match",
        truncated: "not a usable etcd snapshot",
    }
    for path, reason in cases.items():
        data_dir = tmp_path / f"data-{path.stem}"
        done = restore(path, data_dir, "https://127.0.0.1:2380", tmp_path)
        assert done.returncode == 1, (path, done.stdout)
        assert reason in done.stderr, (path, done.stderr)
        assert "nothing changed" in done.stderr
        assert not data_dir.exists()
        assert not [p for p in tmp_path.iterdir() if ".restore-" in p.name]


def test_restore_refuses_a_member_etcd_would_not_start(snapshot: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    done = podnet(
        *("adm", "restore", str(snapshot), "--data-dir", str(data_dir), "--name", MEMBER),
        *("--initial-advertise-peer-urls", "https://127.0.0.1:2380"),
        *("--initial-cluster", "etcd2=https://127.0.0.1:2381"),
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "--initial-cluster must list etcd1" in done.stderr
    assert not data_dir.exists()


def test_backup_finds_the_local_clusters_etcd(cluster: Cluster, tmp_path: Path) -> None:
    """Without --etcd, next to `podnet cluster up`: its members and the masters' client
    certificate (``<state>/etcd-pki``, which the fixture's PKI is)."""
    member = cluster.etcd
    record = EtcdMemberRecord(MEMBER, member.client_port, member.peer_port)
    ClusterState(etcd_members=[record]).save(tmp_path)
    output = tmp_path / "local.db"
    done = podnet("adm", "backup", "-o", str(output), "--state-dir", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"the local cluster at {tmp_path}" in done.stdout
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
