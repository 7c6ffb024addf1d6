"""TLS bootstrap against a real master, with the real kubectl (1.32): a host with a
bootstrap token gets a node client certificate (``podnet.client.bootstrap``) that
kubectl then authenticates with; the admin approves and denies pending requests with
``kubectl certificate approve|deny`` (the ``/approval`` subresource, in protobuf)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podnet.api.pki import Pki
from podnet.client.aio import AsyncApiClient
from podnet.client.bootstrap import bootstrap_node
from podnet.client.errors import StatusError
from podnet.kubeconfig import ClientConfig, load_client_config
from podnet.model.csr import CLIENT_SIGNER, encode_request
from podnet.model.kinds import NODE
from podnet.testing.api import bootstrap_token, node
from podnet.testing.cli import run_kubectl
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess

pytestmark = pytest.mark.usefixtures("kubectl")


def bootstrap_config(master: MasterProcess) -> ClientConfig:
    token = bootstrap_token(master.state_dir)
    return ClientConfig(master.server, Pki.at(master.state_dir / "pki").ca_pem(), token)


async def test_a_host_bootstraps_a_node_kubeconfig_kubectl_uses(
    master: MasterProcess, tmp_path: Path
) -> None:
    config = bootstrap_config(master)
    key, out = tmp_path / "node.key", tmp_path / "node.kubeconfig"
    await bootstrap_node(config, "n1", key, out, timeout=30)
    assert key.stat().st_mode & 0o777 == 0o600 and out.stat().st_mode & 0o777 == 0o600
    assert config.token is not None and config.token not in out.read_text()
    nodes = run_kubectl(out, "get", "nodes")
    assert nodes.returncode == 0, nodes.stderr  # a node reads nodes
    made = run_kubectl(out, "create", "namespace", "x")
    assert made.returncode != 0 and "Forbidden" in made.stderr, made.stderr
    assert "system:node:n1" in made.stderr  # the certificate's identity
    client = AsyncApiClient(load_client_config(str(out)))  # podnet's own client, too
    try:
        created = await client.create(NODE, node("n1", "192.0.2.1"))
        assert created["metadata"]["name"] == "n1"
        with pytest.raises(StatusError) as refused:
            await client.create(NODE, node("n2", "192.0.2.2"))
        assert refused.value.code == 403
    finally:
        await client.close()


def _csr_manifest(tmp_path: Path, name: str) -> Path:
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    manifest = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": encode_request(key, f"{name}-user", ("team-a",)),
            "signerName": CLIENT_SIGNER,
            "usages": ["digital signature", "client auth"],
        },
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(manifest))
    return path


def test_the_admin_approves_and_denies_with_kubectl(master: MasterProcess, tmp_path: Path) -> None:
    for name in ("dev", "bad"):
        created = run_kubectl(master.kubeconfig, "create", "-f", str(_csr_manifest(tmp_path, name)))
        assert created.returncode == 0, created.stderr
    listed = run_kubectl(master.kubeconfig, "get", "csr")
    assert listed.returncode == 0 and "Pending" in listed.stdout, listed.stdout + listed.stderr
    approved = run_kubectl(master.kubeconfig, "certificate", "approve", "dev")
    assert approved.returncode == 0, approved.stderr
    denied = run_kubectl(master.kubeconfig, "certificate", "deny", "bad")
    assert denied.returncode == 0, denied.stderr

    def issued() -> str:
        got = run_kubectl(
            master.kubeconfig, "get", "csr", "dev", "-o", "jsonpath={.status.certificate}"
        )
        return got.stdout.strip()

    assert wait_for(issued, 20, "the approved CSR's certificate")
    listed = run_kubectl(master.kubeconfig, "get", "csr")
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert "Approved,Issued" in rows["dev"] and "Denied" in rows["bad"], listed.stdout
    bad = run_kubectl(master.kubeconfig, "get", "csr", "bad", "-o", "jsonpath={.status}")
    assert '"certificate"' not in bad.stdout
    again = run_kubectl(master.kubeconfig, "certificate", "approve", "bad")  # a decision stays
    assert again.returncode != 0, again.stdout
