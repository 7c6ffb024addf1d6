"""Where a rotated client certificate is written (``podnet.agent.certfiles``): one atomic
write in every layout, the rest of the kubeconfig kept, and what is written reads back
through ``load_client_config`` and loads into the client's TLS context."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from podnet.agent.certfiles import credential_write, read_document
from podnet.api.pki import ensure_pki, key_pem, load_ca, sign_client_certificate
from podnet.client.tls import ssl_context
from podnet.files import write_atomic
from podnet.kubeconfig import KubeconfigError, load_client_config
from podnet.kubeconfig import kubeconfig_document as document

Pair = tuple[bytes, bytes]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Pair, Pair]:
    """The CA's PEM and two node certificates with their keys."""
    pki = ensure_pki(tmp_path_factory.mktemp("pki"), ["127.0.0.1"])
    ca = load_ca(pki)

    def pair() -> Pair:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = sign_client_certificate(
            *ca, "system:node:a", ["system:nodes"], key.public_key(), dt.timedelta(hours=1)
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)

    return pki.ca_pem(), pair(), pair()


def kubeconfig(tmp_path: Path, ca: bytes, user: dict[str, Any]) -> Path:
    doc = document("https://127.0.0.1:6443", ca, "", "system:node:a")
    doc["users"][0]["user"] = user
    doc["preferences"] = {"colors": True}  # something of the operator's, to keep
    path = tmp_path / "node.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def apply(path: Path, cert: bytes, key: bytes) -> str:
    write = credential_write(path, read_document(path), cert, key)
    write_atomic(write.path, write.data, 0o600)
    return write.note


def test_an_embedded_pair_is_replaced_and_the_rest_kept(
    tmp_path: Path, pairs: tuple[bytes, Pair, Pair]
) -> None:
    ca, (old_cert, old_key), (new_cert, new_key) = pairs
    b64 = base64.b64encode
    path = kubeconfig(
        tmp_path,
        ca,
        {
            "client-certificate-data": b64(old_cert).decode(),
            "client-key-data": b64(old_key).decode(),
        },
    )
    before = yaml.safe_load(path.read_text())
    apply(path, new_cert, new_key)
    after = yaml.safe_load(path.read_text())
    assert path.stat().st_mode & 0o777 == 0o600
    assert after["clusters"] == before["clusters"] and after["contexts"] == before["contexts"]
    assert after["preferences"] == {"colors": True}
    config = load_client_config(str(path))
    assert (config.client_cert_data, config.client_key_data) == (new_cert, new_key)
    ssl_context(config)  # the pair loads
    assert [p.name for p in tmp_path.iterdir()] == ["node.kubeconfig"]  # no temp left


def test_one_file_named_for_both_is_rewritten_and_the_kubeconfig_kept(
    tmp_path: Path, pairs: tuple[bytes, Pair, Pair]
) -> None:
    ca, (old_cert, old_key), (new_cert, new_key) = pairs
    pem = tmp_path / "client-current.pem"
    pem.write_bytes(old_cert + old_key)
    path = kubeconfig(
        tmp_path, ca, {"client-certificate": "client-current.pem", "client-key": str(pem)}
    )
    text = path.read_text()
    note = apply(path, new_cert, new_key)
    assert path.read_text() == text and str(pem) in note
    assert pem.read_bytes() == new_cert + new_key and pem.stat().st_mode & 0o777 == 0o600
    config = load_client_config(str(path))
    assert x509.load_pem_x509_certificate(config.client_cert_data or b"") == (
        x509.load_pem_x509_certificate(new_cert)
    )
    ssl_context(config)


def test_two_named_files_become_an_embedded_pair_in_one_write(
    tmp_path: Path, pairs: tuple[bytes, Pair, Pair]
) -> None:
    ca, (old_cert, old_key), (new_cert, new_key) = pairs
    (tmp_path / "c.crt").write_bytes(old_cert)
    (tmp_path / "c.key").write_bytes(old_key)
    path = kubeconfig(tmp_path, ca, {"client-certificate": "c.crt", "client-key": "c.key"})
    note = apply(path, new_cert, new_key)
    assert "no longer read" in note
    user = yaml.safe_load(path.read_text())["users"][0]["user"]
    assert set(user) == {"client-certificate-data", "client-key-data"}
    config = load_client_config(str(path))
    assert (config.client_cert_data, config.client_key_data) == (new_cert, new_key)
    assert (tmp_path / "c.crt").read_bytes() == old_cert  # left alone


def test_a_kubeconfig_without_a_user_is_an_error_and_nothing_is_written(
    tmp_path: Path, pairs: tuple[bytes, Pair, Pair]
) -> None:
    ca, _, (new_cert, new_key) = pairs
    path = kubeconfig(tmp_path, ca, {})
    doc = yaml.safe_load(path.read_text())
    doc["contexts"][0]["context"].pop("user")
    path.write_text(yaml.safe_dump(doc))
    text = path.read_text()
    with pytest.raises(KubeconfigError, match="names no user"):
        credential_write(path, read_document(path), new_cert, new_key)
    assert path.read_text() == text
