"""Discovery's pure parts (``podnet.api.clusterinfo``): kubeadm's CA pin, the answer's
shape, and the masters' URLs from the default/kubernetes endpoints."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from podnet.api.clusterinfo import ca_cert_hash, check_ca_hash, document, master_urls, parse
from podnet.api.pki import ensure_pki
from podnet.client.discovery import DiscoveryError, check_server


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return ensure_pki(tmp_path_factory.mktemp("pki"), ["127.0.0.1"]).ca_pem()


def test_the_pin_is_sha256_of_the_subject_public_key_info(ca: bytes) -> None:
    spki = (
        x509.load_pem_x509_certificate(ca)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    assert ca_cert_hash(ca) == "sha256:" + hashlib.sha256(spki).hexdigest()
    check_ca_hash(ca, ca_cert_hash(ca))
    check_ca_hash(ca, ca_cert_hash(ca).upper().replace("SHA256:", "sha256:"))


@pytest.mark.parametrize(
    "given",
    ["", "sha256:", "md5:" + "0" * 64, "sha256:" + "0" * 63, "0" * 64, "sha256:" + "0" * 64],
)
def test_a_bad_or_other_pin_is_refused(ca: bytes, given: str) -> None:
    with pytest.raises(ValueError):
        check_ca_hash(ca, given)


def test_another_ca_is_refused_even_with_a_valid_looking_pin(ca: bytes, tmp_path: Path) -> None:
    other = ensure_pki(tmp_path, ["127.0.0.1"]).ca_pem()
    with pytest.raises(ValueError, match="refusing to trust it"):
        check_ca_hash(other, ca_cert_hash(ca))
    with pytest.raises(ValueError, match="does not parse"):
        check_ca_hash(b"junk", ca_cert_hash(ca))


def test_answers_are_parsed_or_refused(ca: bytes) -> None:
    assert parse(document(ca, ["https://10.0.0.21:6443"])) == (ca, ["https://10.0.0.21:6443"])
    assert parse(document(ca, ["http://evil:80", "https://a:1"]))[1] == ["https://a:1"]
    bad: object
    for bad in (
        None,
        [],
        {"kind": "Other"},
        {"kind": "ClusterInfo"},
        {"kind": "ClusterInfo", "certificateAuthorityData": "%%%"},
        {
            "kind": "ClusterInfo",
            "certificateAuthorityData": base64.b64encode(ca).decode(),
            "servers": "https://a:1",
        },
    ):
        with pytest.raises(ValueError):
            parse(bad)


def test_masters_come_from_the_kubernetes_endpoints() -> None:
    endpoints = {
        "subsets": [
            {
                "addresses": [{"ip": "10.0.0.22"}, {"ip": "10.0.0.21"}, {}],
                "ports": [{"name": "https", "port": 6443}],
            }
        ]
    }
    assert master_urls(endpoints) == ["https://10.0.0.21:6443", "https://10.0.0.22:6443"]
    assert master_urls(None) == []


@pytest.mark.parametrize(
    "server",
    [
        "http://10.0.0.21:6443",
        "https://",
        "https://a:1/path",
        "https://u:p@a:1",
        "a:1",
        "https://a:1?x=1",
    ],
)
def test_a_server_is_an_https_host_and_port(server: str) -> None:
    with pytest.raises(DiscoveryError):
        check_server(server)
    assert check_server("https://10.0.0.21:6443/") == "https://10.0.0.21:6443"
