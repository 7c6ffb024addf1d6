"""The agent's rotation loop (``podnet.agent.certrotation``) against a scripted master:
it waits for the rotation point, asks in its own name, and only a certificate in hand is
written; a denied request leaves the kubeconfig byte for byte as it was and is retried
after a backoff; the client is handed the new credentials (no restart); a kubeconfig
holding a token or a certificate that is not a node's is not rotated."""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client import CollectorRegistry

from podnet.agent import certrotation
from podnet.agent.certrotation import CertRotator
from podnet.api.pki import ensure_pki, key_pem, load_ca, sign_client_certificate
from podnet.client.aio import AsyncApiClient
from podnet.client.bootstrap import node_kubeconfig
from podnet.kubeconfig import ClientConfig, load_client_config, write_kubeconfig
from podnet.model.csr import parse_request, subject_of

CA = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]
HOUR = dt.timedelta(hours=1)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CA:
    return load_ca(ensure_pki(tmp_path_factory.mktemp("pki"), ["127.0.0.1"]))


def issue(ca: CA, public: ec.EllipticCurvePublicKey, cn: str = "system:node:a") -> bytes:
    cert = sign_client_certificate(*ca, cn, ["system:nodes"], public, HOUR)
    return cert.public_bytes(serialization.Encoding.PEM)


class Enough(Exception):
    """The script has no more verdicts: the test has seen what it wanted."""


class ScriptedMaster:
    """What ``request_certificate`` calls: ``create`` and ``get`` of CSRs, answered from
    ``verdicts`` in turn ("deny" or "sign"); ``reload`` records the new configuration."""

    def __init__(self, ca: CA, config: ClientConfig, verdicts: list[str]) -> None:
        self.ca, self.config, self.verdicts = ca, config, verdicts
        self.asked: list[dict[str, Any]] = []
        self.reloaded: list[ClientConfig] = []

    async def create(self, kind: Any, obj: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(obj)
        return obj

    async def get(self, kind: Any, namespace: None, name: str) -> dict[str, Any]:
        obj = self.asked[-1]
        if not self.verdicts:
            raise Enough
        if self.verdicts.pop(0) == "deny":
            condition = {"type": "Denied", "reason": "NotOwnNode", "message": "no"}
            return {**obj, "status": {"conditions": [condition]}}
        csr = parse_request(obj["spec"]["request"])
        public = csr.public_key()
        assert isinstance(public, ec.EllipticCurvePublicKey)
        pem = issue(self.ca, public, subject_of(csr).common_name)
        return {**obj, "status": {"certificate": base64.b64encode(pem).decode()}}

    def reload(self, config: ClientConfig) -> None:
        self.reloaded.append(config)
        self.config = config


def joined(tmp_path: Path, ca: CA) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    ca_pem = ca[0].public_bytes(serialization.Encoding.PEM)
    text = node_kubeconfig(
        "https://127.0.0.1:6443", ca_pem, "a", issue(ca, key.public_key()), key_pem(key)
    )
    path = tmp_path / "node.kubeconfig"
    path.write_text(text)
    path.chmod(0o600)
    return path


def rotator(master: ScriptedMaster, path: Path, **kw: Any) -> CertRotator:
    return CertRotator(cast(AsyncApiClient, master), path, "a", **kw)


async def test_a_denied_request_writes_nothing_and_is_retried_after_a_backoff(
    tmp_path: Path, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = joined(tmp_path, ca)
    before = path.read_bytes()
    master = ScriptedMaster(ca, load_client_config(str(path)), ["deny", "sign"])
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        assert path.read_bytes() == before  # the failed try left the file as it was
        slept.append(seconds)

    monkeypatch.setattr(certrotation.asyncio, "sleep", sleep)
    rotating = rotator(master, path)
    old = rotating.certificate()
    new = await rotating.rotate_until_done(old)

    assert len(slept) == 1 and 0 < slept[0] <= 300
    assert rotating.rotations == {"ok": 1, "error": 1}
    assert new.serial_number != old.serial_number
    for asked in master.asked:  # in its own name, for a client certificate only
        subject = subject_of(parse_request(asked["spec"]["request"]))
        assert (subject.common_name, subject.organizations) == ("system:node:a", ("system:nodes",))
        assert asked["spec"]["usages"] == ["client auth", "digital signature", "key encipherment"]
    config = load_client_config(str(path))
    assert x509.load_pem_x509_certificate(config.client_cert_data or b"") == new
    assert path.stat().st_mode & 0o777 == 0o600
    assert master.reloaded == [config]  # the client has it, no restart
    registry = CollectorRegistry()
    registry.register(rotating)
    expiry = registry.get_sample_value("podnet_node_client_certificate_expiration_seconds")
    assert expiry == new.not_valid_after_utc.timestamp()


async def test_it_sleeps_until_the_rotation_point_then_rotates(
    tmp_path: Path, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = joined(tmp_path, ca)
    master = ScriptedMaster(ca, load_client_config(str(path)), ["sign"])
    cert = x509.load_pem_x509_certificate(master.config.client_cert_data or b"")
    clock = [cert.not_valid_before_utc]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        if not master.reloaded:  # the first round's wait (the second may wait a little)
            slept.append(seconds)
        clock[0] += dt.timedelta(seconds=seconds)

    monkeypatch.setattr(certrotation.asyncio, "sleep", sleep)
    rotating = rotator(master, path, draw=lambda: 0.5, now=lambda: clock[0])
    with pytest.raises(Enough):  # the next round asks again: stop there
        await rotating.run()
    life = (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds()
    assert sum(slept) == pytest.approx(0.8 * life)  # 70 % + 0.5 of the 20 % jitter
    assert max(slept) <= certrotation.MAX_SLEEP  # the wall clock is read again often
    assert len(master.reloaded) == 1 and rotating.rotations["ok"] == 1


def test_only_a_nodes_client_certificate_is_rotated(tmp_path: Path, ca: CA) -> None:
    token = tmp_path / "token.kubeconfig"
    write_kubeconfig(
        token, "https://127.0.0.1:6443", ca[0].public_bytes(serialization.Encoding.PEM), "t"
    )
    assert CertRotator.for_client(AsyncApiClient(load_client_config(str(token)))) is None
    path = joined(tmp_path, ca)
    config = load_client_config(str(path))
    found = CertRotator.for_client(AsyncApiClient(config))
    assert found is not None and found.node == "a" and found.kubeconfig == path
    key = ec.generate_private_key(ec.SECP256R1())
    someone = replace(
        config,
        client_cert_data=issue(ca, key.public_key(), "someone"),
        client_key_data=key_pem(key),
    )
    assert CertRotator.for_client(AsyncApiClient(someone)) is None
