"""etcd endpoints, the client's gRPC target, and a member's command line (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from podnet.store.etcd_client import EndpointError, grpc_target, parse_endpoints
from podnet.store.etcd_pki import EtcdPki
from podnet.store.etcd_process import EtcdProcess


def test_endpoints_comma_separated_repeated_and_with_scheme() -> None:
    assert parse_endpoints(["127.0.0.1:2379,127.0.0.1:2479", "https://10.0.0.3:2379/"]) == [
        ("127.0.0.1", 2379),
        ("127.0.0.1", 2479),
        ("10.0.0.3", 2379),
    ]
    assert grpc_target(parse_endpoints("127.0.0.1:1,127.0.0.1:2")) == "ipv4:127.0.0.1:1,127.0.0.1:2"


@pytest.mark.parametrize("bad", ["", "127.0.0.1", "127.0.0.1:x", ":2379", "h:0", "h:70000"])
def test_bad_endpoints_are_refused(bad: str) -> None:
    with pytest.raises(EndpointError):
        parse_endpoints(bad)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_tls_member_listens_on_loopback_with_client_certificates(tmp_path: Path) -> None:
    pki = EtcdPki(tmp_path / "pki")
    member = EtcdProcess(tmp_path / "e1", 2379, 2380, name="e1", pki=pki)
    member.initial_cluster = "e1=https://127.0.0.1:2380,e2=https://127.0.0.1:2480"
    argv = member.command()
    assert _flag(argv, "--listen-client-urls") == "https://127.0.0.1:2379"
    assert _flag(argv, "--listen-peer-urls") == "https://127.0.0.1:2380"
    assert "--client-cert-auth" in argv and "--peer-client-cert-auth" in argv
    assert _flag(argv, "--trusted-ca-file") == str(pki.ca)
    assert _flag(argv, "--peer-trusted-ca-file") == str(pki.peer_ca)  # a separate CA
    assert _flag(argv, "--cert-file") == str(pki.member("e1").cert)
    assert _flag(argv, "--initial-cluster").count("https://127.0.0.1:") == 2


def test_plain_member_for_tests_has_no_tls_flags(tmp_path: Path) -> None:
    argv = EtcdProcess(tmp_path, 2379, 2380).command()
    assert _flag(argv, "--listen-client-urls") == "http://127.0.0.1:2379"
    assert not [a for a in argv if "cert" in a]
