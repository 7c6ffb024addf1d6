"""The support bundle's redaction (PEM blocks, token lines, kubeconfig fields, the cluster's
known secrets) and its writer (errors recorded, size cap, mode 0600, atomic rename)."""

from __future__ import annotations

import base64
import json
import stat
import tarfile
from pathlib import Path

import pytest

from podnet.cluster.diagnose import cap_text, is_log, log_files, read_tail, write_bundle
from podnet.cluster.diagnose_redact import (
    MARK,
    known_secrets,
    redact,
    redact_fields,
    redact_known,
    redact_object,
    redact_pem,
)

BODY = "MHcCAQEEIBm7Jq0Yb3Xz4kQmYc1Tn0h9Qe2b1Vx6k7bJ9u8nQm1RoAoGCCqGSM49"
KEY = (
    f"-----BEGIN EC PRIVATE KEY-----\n{BODY}\n"
    "AwEHoUQDQgAEaBcDeF0123456789abcdef\n-----END EC PRIVATE KEY-----\n"
)
CERT = "-----BEGIN CERTIFICATE-----\nMIIBbzCCARWgAwIBAgIU\n-----END CERTIFICATE-----\n"
TOKEN = "LtH-U_7viJUhXGaoEAVq-iS5Vu6NsVITyYVEfHA36cs"
NODE_TOKEN = "1jXrDOwYvq_fdYg2UdsYOsTqEbv8SUv21_6zoBte8IY"


def kubeconfig(token: str = TOKEN, key: str = KEY) -> str:
    key_data = base64.b64encode(key.encode()).decode()
    return (
        "apiVersion: v1\nkind: Config\nclusters:\n- name: podnet\n  cluster:\n"
        "    server: https://127.0.0.1:6443\n"
        "users:\n- name: admin\n  user:\n"
        f"    token: {token}\n    client-key-data: {key_data}\n"
        "    client-certificate-data: Q0VSVA==\n"
    )


@pytest.mark.parametrize(
    "kind", ["PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY", "ENCRYPTED PRIVATE KEY"]
)
def test_pem_private_key_blocks_are_removed_and_certificates_kept(kind: str) -> None:
    key = KEY.replace("EC PRIVATE KEY", kind)
    text = redact_pem(f"before\n{key}{CERT}after\n")
    assert BODY not in text and "BEGIN " + kind not in text
    assert f"-----{MARK} {kind}-----" in text
    assert CERT in text and text.startswith("before\n") and text.endswith("after\n")


def test_a_pem_block_cut_short_is_removed_to_the_end() -> None:
    text = redact_pem("log line\n" + KEY[:60])
    assert text == f"log line\n-----{MARK} EC PRIVATE KEY-----"


def test_tokens_csv_lines_lose_their_token_column_only() -> None:
    csv = f"{TOKEN},admin,491484e0-d7ba,system:masters\n{NODE_TOKEN},system:node:node1,fd7c\n"
    text = redact_fields(csv)
    assert TOKEN not in text and NODE_TOKEN not in text
    assert text.splitlines() == [
        f"{MARK},admin,491484e0-d7ba,system:masters",
        f"{MARK},system:node:node1,fd7c",
    ]


def test_log_lines_that_look_like_csv_are_kept() -> None:
    line = "2026-12-07 15:09:42,660 INFO podnet.master: a,b,c"
    assert redact_fields(line) == line


def test_kubeconfig_token_and_client_key_data_fields() -> None:
    text = redact_fields(kubeconfig())
    assert TOKEN not in text
    assert base64.b64encode(KEY.encode()).decode() not in text
    assert f"    token: {MARK}\n" in text and f"    client-key-data: {MARK}\n" in text
    assert "client-certificate-data: Q0VSVA==" in text  # not a secret
    assert "server: https://127.0.0.1:6443" in text


def test_json_fields_and_bearer_headers() -> None:
    doc = json.dumps({"user": {"token": TOKEN, "name": "admin"}, "password": "hunter2hunter2"})
    text = redact_fields(doc + f"\nAuthorization: Bearer {NODE_TOKEN}\n")
    assert TOKEN not in text and "hunter2" not in text and NODE_TOKEN not in text
    assert '"name": "admin"' in text and f"Bearer {MARK}" in text


def test_known_secrets_are_replaced_wherever_they_appear() -> None:
    text = f"annotation: x{NODE_TOKEN}y and {BODY} alone"
    out = redact_known(text, {NODE_TOKEN, BODY, "short"})
    assert out == f"annotation: x{MARK}y and {MARK} alone"


def test_redact_object_replaces_credential_keys_at_any_depth() -> None:
    obj = {"metadata": {"name": "n"}, "spec": [{"token": TOKEN, "keyData": "abc", "port": 1}]}
    assert redact_object(obj) == {
        "metadata": {"name": "n"},
        "spec": [{"token": MARK, "keyData": MARK, "port": 1}],
    }


def test_known_secrets_reads_tokens_files_kubeconfigs_token_files_and_keys(
    tmp_path: Path,
) -> None:
    (tmp_path / "master").mkdir()
    (tmp_path / "master" / "tokens.csv").write_text(f"{TOKEN},admin,uid,system:masters\n")
    (tmp_path / "node.kubeconfig").write_text(kubeconfig(NODE_TOKEN))
    (tmp_path / "router.token").write_text("routertokenvalue123\n")
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "server.key").write_text(KEY)
    (tmp_path / "link.key").symlink_to("/etc/hostname")
    found = known_secrets([tmp_path])
    assert {TOKEN, NODE_TOKEN, "routertokenvalue123", BODY} <= found
    assert base64.b64encode(KEY.encode()).decode() in found
    # what it found redacts a key's body line that appears without its BEGIN line
    assert BODY not in redact(f"tail of a log: {BODY}\n", found)


def test_log_selection_and_tail(tmp_path: Path) -> None:
    for name in ("master.log", "audit.log.1", "tokens.csv", "ca.key", "state.json"):
        (tmp_path / name).write_text("x" * 100)
    (tmp_path / "link.log").symlink_to(tmp_path / "ca.key")
    assert [p.name for p in log_files(tmp_path)] == ["audit.log.1", "master.log"]
    assert is_log(Path("a.log")) and not is_log(Path("catalog"))
    (tmp_path / "big.log").write_text("a" * 50 + "b" * 50)
    tail = read_tail(tmp_path / "big.log", cap=50)
    assert tail.endswith("b" * 50) and "a" not in tail.splitlines()[1]
    assert "first 50 of 100 bytes omitted" in tail


def test_cap_text_cuts_with_a_note() -> None:
    assert cap_text("abc", 10) == (b"abc", False)
    data, cut = cap_text("a" * 30, 10)
    assert cut and data.startswith(b"a" * 10) and b"cut at 10 of 30 bytes" in data


def test_write_bundle_records_failures_redacts_caps_and_is_0600(tmp_path: Path) -> None:
    def boom() -> str:
        raise RuntimeError("collector broke")

    out = tmp_path / "b.tar.gz"
    items = [
        ("logs/a.log", lambda: f"token {NODE_TOKEN}\n{KEY}"),
        ("broken.txt", boom),
        ("big.txt", lambda: "z" * 5000),
        ("after.txt", lambda: "still here"),
    ]
    report = write_bundle(out, items, {NODE_TOKEN}, cap=1024)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.tar.gz"]
    with tarfile.open(out) as tar:
        got = {
            i.name.split("/", 1)[1]: tar.extractfile(i).read().decode()  # type: ignore[union-attr]
            for i in tar.getmembers()
        }
        assert all(i.mode == 0o600 for i in tar.getmembers())
    assert NODE_TOKEN not in got["logs/a.log"] and BODY not in got["logs/a.log"]
    assert "broken.txt" not in got and "collector broke" in got["errors.txt"]
    assert got["after.txt"] == "still here"
    assert "cut at 1024 of 5000 bytes" in got["big.txt"]
    assert "big.txt" in got["MANIFEST.txt"] and report.cut == ["big.txt"]


def test_write_bundle_leaves_nothing_when_it_fails(tmp_path: Path) -> None:
    def interrupted() -> str:
        raise KeyboardInterrupt

    out = tmp_path / "b.tar.gz"
    with pytest.raises(KeyboardInterrupt):
        write_bundle(out, [("x", interrupted)], ())
    assert list(tmp_path.iterdir()) == []


def test_bootstrap_tokens_are_redacted_wherever_they_show() -> None:
    # their secret is on no disk (only its hash, in etcd): the pattern must catch them
    text = "ran `podnet adm token create`: 07401b.f395accd246ae52d, id 07401b\n"
    redacted = redact_fields(text)
    assert "f395accd246ae52d" not in redacted
    assert redacted == f"ran `podnet adm token create`: {MARK}, id 07401b\n"


def test_an_imported_tokens_file_is_still_a_tokens_file(tmp_path: Path) -> None:
    # a master renames tokens.csv to tokens.csv.imported after importing it into etcd
    (tmp_path / "tokens.csv.imported").write_text(f"{TOKEN},admin,uid,system:masters\n")
    assert TOKEN in known_secrets([tmp_path])
