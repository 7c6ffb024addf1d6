"""Identities that every master agrees on (issue 20): two real masters on one etcd.

Tokens live hashed in etcd (``podnet.api.tokenrecords``); a token issued through one
master's state dir works on the other at once, a deleted one is refused by both within
5 s, bootstrap tokens (``podnet adm token``) expire, are refused everything (403), and
bad input to ``adm token`` changes nothing. Before, each master read its own
``tokens.csv``: a token issued through one master was refused by the other.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from podnet.master import node_credentials
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for, kubeconfig_parts
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess, launch_master

LEGACY = "legacy-token-0123456789abcdefghijklmnop"


@pytest.fixture(scope="module")
def prefix() -> str:
    """One key prefix for this module's two masters (conftest's is per test)."""
    return f"/podnet-test-{uuid.uuid4().hex[:12]}/"


@pytest.fixture(scope="module")
def masters(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory, prefix: str
) -> Iterator[tuple[MasterProcess, MasterProcess]]:
    """Two masters on one etcd and prefix, each with its own state dir (module-wide)."""
    tmp_path = tmp_path_factory.mktemp("masters")
    second_dir = tmp_path / "m2"
    second_dir.mkdir(mode=0o700)
    # a state dir of before: its tokens.csv is imported into etcd once, then not read
    (second_dir / "tokens.csv").write_text(f"{LEGACY},legacy-reader,u-1,system:monitoring\n")
    first = launch_master(etcd, tmp_path / "m1", prefix)
    try:
        second = launch_master(etcd, second_dir, prefix)
        try:
            yield first, second
        finally:
            second.stop()
    finally:
        first.stop()


def status(master: MasterProcess, token: str, path: str = "/api/v1/nodes") -> int:
    with client_for(master.kubeconfig, token=token, timeout=5) as client:
        return client.get(path).status_code


def adm_token(master: MasterProcess, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "podnet", "adm", "token", *args]
    argv += ["--state-dir", str(master.state_dir)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def raw_records(etcd: EtcdProcess, prefix: str) -> dict[str, bytes]:
    async def read() -> dict[str, bytes]:
        store = EtcdStore(etcd.endpoint)
        await store.connect()
        try:
            items, _ = await store.list(f"{prefix}identities/tokens/")
            return {kv.key: kv.value for kv in items}
        finally:
            await store.close()

    return asyncio.run(read())


def refused_within(masters: tuple[MasterProcess, ...], token: str, bound: float) -> None:
    """Every master answers 401 to ``token`` within ``bound`` seconds (polled; a bounded
    wait that fails with the masters still accepting it)."""
    pending = list(masters)

    def all_refuse() -> bool:
        pending[:] = [m for m in pending if status(m, token) != 401]
        return not pending

    wait_for(all_refuse, bound, f"every master to refuse the token (left: {pending})")


def test_a_token_works_on_every_master_and_a_deleted_one_on_none_within_5s(
    masters: tuple[MasterProcess, MasterProcess], etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    first, second = masters
    kubeconfig = node_credentials(first.state_dir, "n1", first.server, tmp_path / "n1.kc")
    _, _, token = kubeconfig_parts(kubeconfig)
    assert status(second, token) == 200  # at once: read from etcd on a miss
    assert status(first, token) == 200
    assert not (first.state_dir / "tokens.csv").exists()
    # stored hashed: the key is its digest, and no value holds the token
    records = raw_records(etcd, prefix)
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert f"{prefix}identities/tokens/{digest}" in records
    assert all(token.encode() not in k.encode() + v for k, v in records.items())
    listed = adm_token(second, "list", "--all")
    assert listed.returncode == 0, listed.stderr
    assert digest[:16] in listed.stdout and token not in listed.stdout
    deleted = adm_token(second, "delete", digest[:16])
    assert deleted.returncode == 0, deleted.stderr
    refused_within(masters, token, 5.0)  # every master refuses it within 5 s
    # each master has its own admin token, also in etcd (hashed)
    admins = {kubeconfig_parts(m.kubeconfig)[2] for m in masters}
    assert len(admins) == 2
    assert all(status(m, t) == 200 for m in masters for t in admins)


def test_a_legacy_tokens_csv_is_imported_once_and_no_longer_read(
    masters: tuple[MasterProcess, MasterProcess], etcd: EtcdProcess, prefix: str
) -> None:
    first, second = masters
    assert status(first, LEGACY, "/metrics") == 200  # imported by the second, seen by both
    assert not (second.state_dir / "tokens.csv").exists()
    assert (second.state_dir / "tokens.csv.imported").exists()
    assert "no longer read" in second.log_path.read_text()
    records = raw_records(etcd, prefix)
    assert all(LEGACY.encode() not in v for v in records.values())
    digest = hashlib.sha256(LEGACY.encode()).hexdigest()
    assert adm_token(first, "delete", digest[:16]).returncode == 0
    refused_within(masters, LEGACY, 5.0)


def test_bootstrap_tokens_may_only_ask_for_certificates_expire_and_are_revoked(
    masters: tuple[MasterProcess, MasterProcess], etcd: EtcdProcess, prefix: str
) -> None:
    first, second = masters
    made = adm_token(first, "create", "--node", "n7", "--description", "join n7")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    token_id, _, secret = token.partition(".")
    assert len(token_id) == 6 and len(secret) == 16
    for master in masters:
        for path in ("/api/v1/pods", "/api/v1/nodes", "/api/v1/namespaces/default/pods"):
            assert status(master, token, path) == 403, path
        csrs = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
        assert status(master, token, csrs) == 200  # its own requests (none yet)
    with client_for(second.kubeconfig, token=token) as client:
        answer = client.get("/api/v1/nodes").json()
        assert f"system:bootstrap:{token_id}" in answer["message"]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectRulesReview",
            "spec": {"namespace": "default"},
        }
        reviews = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"
        rules = client.post(reviews, json=review).json()["status"]["resourceRules"]
        granted = {r for rule in rules for r in rule.get("resources", [])}
        assert granted <= {
            "certificatesigningrequests",
            "selfsubjectaccessreviews",
            "selfsubjectrulesreviews",
        }, granted
    listed = adm_token(second, "list")
    assert token_id in listed.stdout and "n7" in listed.stdout and "join n7" in listed.stdout
    assert secret not in listed.stdout
    assert all(secret.encode() not in v for v in raw_records(etcd, prefix).values())
    assert adm_token(second, "delete", token_id).returncode == 0
    refused_within(masters, token, 5.0)
    # expired: refused (401) on both, though its record is still there
    short = adm_token(first, "create", "--ttl", "8s").stdout.strip()
    assert status(second, short) == 403
    wait_for(lambda: all(status(m, short) == 401 for m in masters), 20, "expiry")
    assert short.partition(".")[0] in adm_token(first, "list").stdout  # still listed


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["create", "--ttl", "0s"], "longer than 0s"),
        (["create", "--ttl", "tomorrow"], "bad ttl"),
        (["create", "--ttl", "400d"], "at most 365d"),
        (["create", "--node", "Bad_Node"], "bad node name"),
        (["delete", "zzzzzz"], "no token with id"),
        (["delete", "NOT-AN-ID"], "bad token id"),
    ],
)
def test_adm_token_bad_input_gets_a_clear_error_and_changes_nothing(
    masters: tuple[MasterProcess, MasterProcess],
    etcd: EtcdProcess,
    prefix: str,
    args: list[str],
    words: str,
) -> None:
    first, _ = masters
    before = raw_records(etcd, prefix)
    result = adm_token(first, *args)
    assert result.returncode != 0
    assert words in result.stderr
    assert raw_records(etcd, prefix) == before


def test_adm_token_without_a_master_state_dir_says_so(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "podnet", "adm", "token", "list", "--state-dir", str(tmp_path)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0 and "no etcd.json" in result.stderr


def test_no_token_and_unknown_tokens_are_401(
    masters: tuple[MasterProcess, MasterProcess],
) -> None:
    for master in masters:
        assert status(master, "a" * 43) == 401
        assert status(master, "abcdef.0123456789abcdef") == 401
        with httpx.Client(base_url=master.server, verify=False, timeout=5) as anonymous:
            assert anonymous.get("/api/v1/nodes").status_code == 401
