"""Client-certificate rotation against a real master (etcd, TLS, the CSR approver and
signer) started with ``--cluster-signing-duration 1m``: a node joined by TLS bootstrap
rotates its one-minute certificate at 70-90 % of its life through a CSR made as itself;
the kubeconfig is rewritten (0600) with a new certificate of a new serial and key, and the
same client keeps working, without a restart, after the old certificate has expired.

Attack tests (a master with the default duration): a node's certificate gets no
certificate for another node's name, nor one for server auth or another group.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client import CollectorRegistry

from podnet.agent.certrotation import start_rotation
from podnet.api.pki import Pki, issued_at
from podnet.client.aio import AsyncApiClient
from podnet.client.bootstrap import bootstrap_node
from podnet.client.errors import ClientError
from podnet.kubeconfig import ClientConfig, load_client_config
from podnet.model.csr import KUBELET_CLIENT_SIGNER, encode_request
from podnet.model.kinds import CERTIFICATE_SIGNING_REQUEST as CSR
from podnet.model.kinds import NODE
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import bootstrap_token, cert_client_for, client_for, node
from podnet.testing.e2e import eventually
from podnet.testing.processes import MasterProcess, launch_master

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
MINUTE = 60


@pytest.fixture
def short_lived(etcd: EtcdProcess, tmp_path: Path, prefix: str) -> Iterator[MasterProcess]:
    """A master whose signer issues one-minute client certificates."""
    process = launch_master(etcd, tmp_path / "master", prefix, "--cluster-signing-duration", "1m")
    try:
        yield process
    finally:
        process.stop()


async def join(master: MasterProcess, tmp_path: Path, name: str) -> Path:
    """The node kubeconfig ``podnet adm join node`` writes (client certificate embedded)."""
    ca = Pki.at(master.state_dir / "pki").ca_pem()
    config = ClientConfig(master.server, ca, bootstrap_token(master.state_dir))
    out = tmp_path / f"{name}.kubeconfig"
    await bootstrap_node(config, name, tmp_path / f"{name}.key", out, timeout=30)
    return out


def certificate_in(kubeconfig: Path) -> x509.Certificate:
    user = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
    return x509.load_pem_x509_certificate(base64.b64decode(user["client-certificate-data"]))


async def answers(client: AsyncApiClient, name: str) -> bool:
    try:
        return (await client.get(NODE, None, name))["metadata"]["name"] == name
    except ClientError:
        return False


@pytest.mark.slow
async def test_a_node_rotates_its_certificate_and_keeps_working_without_a_restart(
    short_lived: MasterProcess, tmp_path: Path
) -> None:
    path = await join(short_lived, tmp_path, "n1")
    first = certificate_in(path)
    life = first.not_valid_after_utc - issued_at(first)
    assert life == dt.timedelta(seconds=MINUTE)  # the master's --cluster-signing-duration
    old_kubeconfig = tmp_path / "old.kubeconfig"
    old_kubeconfig.write_text(path.read_text())

    client = AsyncApiClient(load_client_config(str(path)))
    registry = CollectorRegistry()
    failures: list[str] = []
    stop = asyncio.Event()

    async def keep_asking() -> int:
        """What the agent does all along: requests, one every 0.2 s."""
        done = 0
        while not stop.is_set():
            try:
                await client.get(NODE, None, "n1")
                done += 1
            except ClientError as exc:
                failures.append(str(exc))
            await asyncio.sleep(0.2)
        return done

    # a connection of the first certificate, kept open (the master's idle timeout: 120 s)
    old = cert_client_for(old_kubeconfig, keepalive=110)
    try:
        await client.create(NODE, node("n1", "192.0.2.1"))
        assert old.get("/api/v1/nodes/n1").status_code == 200
        rotation = start_rotation(client, registry.register)
        assert rotation is not None
        asking = asyncio.create_task(keep_asking())
        # 70-90 % of (1 min + its 12 s backdate) after notBefore: 38-53 s after issue
        await eventually(
            lambda: certificate_in(path).serial_number != first.serial_number,
            75,
            "the rotated certificate in the kubeconfig",
            interval=0.5,
        )
        second = certificate_in(path)
        assert path.stat().st_mode & 0o777 == 0o600
        assert second.public_key() != first.public_key()  # a new key too
        assert client.config.client_cert_data is not None
        assert x509.load_pem_x509_certificate(client.config.client_cert_data) == second
        reread = load_client_config(str(path))
        assert reread.client_key_data == client.config.client_key_data
        gauge = registry.get_sample_value("podnet_node_client_certificate_expiration_seconds")
        assert gauge == second.not_valid_after_utc.timestamp()
        assert (
            registry.get_sample_value(
                "podnet_node_client_certificate_rotations_total", {"result": "ok"}
            )
            == 1.0
        )

        # past the old certificate's end only the new one authenticates, even on the
        # connection the old one opened while valid (kept alive: each request is checked)
        def refused() -> bool:
            answer = old.get("/api/v1/nodes/n1")
            return answer.status_code == 401 and "has expired" in answer.text

        await eventually(refused, 40, "the old certificate refused", interval=1)
        assert await answers(client, "n1")  # the same client, without a restart
        stop.set()
        done = await asking
        assert failures == [] and done > 100  # not one request failed all along
        await client.close()  # every connection new: they present the new certificate
        assert await answers(client, "n1")
        # it asked as itself, and the approver passed it as a renewal
        with client_for(short_lived.kubeconfig) as admin:
            items = admin.get(CSRS).json()["items"]

            def join_request_removed() -> bool:  # its certificate has expired
                listed = admin.get(CSRS).json()["items"]
                return not any(
                    i["spec"]["username"].startswith("system:bootstrap:") for i in listed
                )

            await eventually(join_request_removed, 10, "the join's request removed", interval=0.5)
        mine = [i for i in items if i["spec"]["username"] == "system:node:n1"]
        issued = [i for i in mine if (i.get("status") or {}).get("certificate")]
        assert issued  # one, or two if the second certificate was due already
        for renewal in issued:
            conditions = renewal["status"]["conditions"]
            assert [c["message"] for c in conditions] == ["renewal by node n1"]
        rotation.cancel()
        await asyncio.gather(rotation, return_exceptions=True)
    finally:
        stop.set()
        old.close()
        await client.close()


def csr(name: str, cn: str, orgs: tuple[str, ...], usages: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": encode_request(ec.generate_private_key(ec.SECP256R1()), cn, orgs),
            "signerName": KUBELET_CLIENT_SIGNER,
            "usages": usages,
        },
    }


async def test_a_node_certificate_gets_no_certificate_for_another_node_or_purpose(
    master: MasterProcess, tmp_path: Path
) -> None:
    path = await join(master, tmp_path, "n1")
    client = AsyncApiClient(load_client_config(str(path)))
    client_usages = ["digital signature", "client auth"]
    try:
        with pytest.raises(ClientError) as refused:
            await client.create(
                CSR, csr("steal", "system:node:n2", ("system:nodes",), client_usages)
            )
        assert refused.value.code == 403 and "may only request" in str(refused.value)
        serving = csr(
            "serving", "system:node:n1", ("system:nodes",), [*client_usages, "server auth"]
        )
        with pytest.raises(ClientError) as invalid:  # the schema refuses the usage
            await client.create(CSR, serving)
        assert invalid.value.code == 422 and "server auth" in str(invalid.value)
        masters = csr(
            "masters", "system:node:n1", ("system:nodes", "system:masters"), client_usages
        )
        await client.create(CSR, masters)  # its own name: created, then denied

        async def denied() -> str | None:
            status = (await client.get(CSR, None, "masters")).get("status") or {}
            assert "certificate" not in status
            reasons = [c["reason"] for c in status.get("conditions", []) if c["type"] == "Denied"]
            return reasons[0] if reasons else None

        assert await eventually(denied, 15, "the request denied", interval=0.2) == "NotANodeSubject"
    finally:
        await client.close()
    with client_for(master.kubeconfig) as admin:
        items = admin.get(CSRS).json()["items"]
    by_node = [i for i in items if i["spec"]["username"] == "system:node:n1"]
    assert [i["metadata"]["name"] for i in by_node] == ["masters"]
    assert not any((i.get("status") or {}).get("certificate") for i in by_node)
