"""The credentials hosts join with, against a real master: a node-bound bootstrap token is
used up once its node's certificate is issued, and the sealed control-plane certificates
(``GET /control-plane-certs``) are read only by an unbound bootstrap token or the admin,
and opened only with the key ``adm certs upload`` printed."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

import httpx
import pytest

from podnet.api.controlplanecerts import (
    FILES,
    SETTINGS,
    SealError,
    new_key,
    open_sealed,
    record_key,
    seal,
)
from podnet.api.pki import Pki
from podnet.api.tokenstore import StoreSettings, issue_sync, run
from podnet.client.bootstrap import BootstrapError, bootstrap_node
from podnet.kubeconfig import ClientConfig
from podnet.store.base import Put
from podnet.testing.api import bootstrap_token
from podnet.testing.processes import MasterProcess


def config(master: MasterProcess, token: str) -> ClientConfig:
    return ClientConfig(master.server, Pki.at(master.state_dir / "pki").ca_pem(), token)


async def test_a_node_bound_token_is_used_up_by_its_certificate(
    master: MasterProcess, tmp_path: Path
) -> None:
    token = bootstrap_token(master.state_dir, node="n7")
    await bootstrap_node(config(master, token), "n7", tmp_path / "k1", tmp_path / "c1", 30)
    with pytest.raises(BootstrapError) as refused:  # the same token, a second time
        await bootstrap_node(config(master, token), "n7", tmp_path / "k2", tmp_path / "c2", 30)
    assert "used up" in str(refused.value)
    assert not (tmp_path / "c2").exists()
    unbound = bootstrap_token(master.state_dir)  # one bound to no node serves many
    await bootstrap_node(config(master, unbound), "n8", tmp_path / "k3", tmp_path / "c3", 30)
    await bootstrap_node(config(master, unbound), "n9", tmp_path / "k4", tmp_path / "c4", 30)


def _upload(master: MasterProcess, key: str) -> None:
    settings = StoreSettings.require(master.state_dir)
    bundle = {name: f"{name} text" for name in (*FILES, *SETTINGS)}
    value = seal(bundle, key, dt.datetime.now(dt.UTC), dt.timedelta(minutes=5))
    run(settings, lambda store: store.commit([], [Put(record_key(settings.prefix), value)]))


def _get(master: MasterProcess, token: str) -> httpx.Response:
    ca = ssl.create_default_context(cafile=str(master.state_dir / "pki" / "ca.crt"))
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{master.server}/control-plane-certs", headers=headers, verify=ca)


def test_the_sealed_certificates_are_read_only_by_whom_may(master: MasterProcess) -> None:
    unbound = bootstrap_token(master.state_dir)
    assert _get(master, unbound).status_code == 404  # nothing uploaded yet
    key = new_key()
    _upload(master, key)
    answer = _get(master, unbound)
    assert answer.status_code == 200, answer.text
    record = answer.json()["record"].encode()
    assert open_sealed(record, key, dt.datetime.now(dt.UTC))["ca.key"] == "ca.key text"
    with pytest.raises(SealError, match="does not open"):
        open_sealed(record, new_key(), dt.datetime.now(dt.UTC))
    bound = _get(master, bootstrap_token(master.state_dir, node="n1"))
    assert bound.status_code == 403 and "bound to node" in bound.text
    assert _get(master, "abcdef.0123456789abcdef").status_code == 401  # no such token
    settings = StoreSettings.require(master.state_dir)
    node_token = issue_sync(settings, "system:node:n2", ["system:nodes"], "a node")
    assert _get(master, node_token).status_code == 403  # a node's identity
