"""A kubeconfig user with a client certificate (as TLS bootstrap writes it): read into
``ClientConfig`` and presented by the client's TLS context; half a pair is an error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from podnet.api.pki import ensure_pki, issue_leaf, key_pem, load_ca
from podnet.client.bootstrap import node_kubeconfig
from podnet.client.errors import ClientConfigError
from podnet.client.tls import ssl_context
from podnet.kubeconfig import load_client_config


def test_a_client_certificate_kubeconfig_is_read_and_loaded(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki", [])
    cert, key = issue_leaf(*load_ca(pki), "system:node:a", set(), [ExtendedKeyUsageOID.CLIENT_AUTH])
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    path = tmp_path / "node.kubeconfig"
    path.write_text(
        node_kubeconfig("https://127.0.0.1:1", pki.ca_pem(), "a", cert_pem, key_pem(key))
    )
    config = load_client_config(str(path))
    assert (config.client_cert_data, config.client_key_data, config.token) == (
        cert_pem,
        key_pem(key),
        None,
    )
    ssl_context(config)  # loads the pair (a mismatch would raise)
    doc = yaml.safe_load(path.read_text())
    del doc["users"][0]["user"]["client-key-data"]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ClientConfigError, match="without the other"):
        ssl_context(load_client_config(str(path)))
    doc["users"][0]["user"]["client-key-data"] = "bm90IGEga2V5"  # "not a key"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ClientConfigError, match="invalid"):
        ssl_context(load_client_config(str(path)))
