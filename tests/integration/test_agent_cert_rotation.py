"""``podnet node --dataplane fake`` as a real process with a joined node's kubeconfig
(client certificate, no token) against a master that signs one-minute certificates
(``--cluster-signing-duration 1m``): the same agent process rotates its certificate,
its ``/metrics`` shows the new expiry, and it keeps renewing its Lease after the first
certificate has expired, without a restart and without an Unauthorized answer."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from cryptography import x509

from podnet.api.pki import Pki
from podnet.client.bootstrap import bootstrap_node
from podnet.kubeconfig import ClientConfig
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import bootstrap_token, client_for
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess, launch_master, stop_process

NODE = "node-1"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"
EXPIRY = "podnet_node_client_certificate_expiration_seconds"


@pytest.fixture
def short_lived(etcd: EtcdProcess, tmp_path: Path, prefix: str) -> Iterator[MasterProcess]:
    process = launch_master(etcd, tmp_path / "master", prefix, "--cluster-signing-duration", "1m")
    try:
        yield process
    finally:
        process.stop()


def certificate_in(kubeconfig: Path) -> x509.Certificate:
    user = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
    return x509.load_pem_x509_certificate(base64.b64decode(user["client-certificate-data"]))


def agent_command(root: Path, kubeconfig: Path) -> list[str]:
    args = [sys.executable, "-m", "podnet", "node", "--kubeconfig", str(kubeconfig)]
    args += ["--node-name", NODE, "--node-ip", "192.0.2.10"]
    args += ["--socket", str(root / "run" / "cni-server.sock"), "--dataplane", "fake"]
    for option in ("cni-bin-dir", "cni-conf-dir", "state-dir", "ipam-dir"):
        args += [f"--{option}", str(root / option)]
    return [*args, "--no-dns", "--metrics-address", "127.0.0.1:0"]


def renewed_at(master: MasterProcess) -> dt.datetime | None:
    with client_for(master.kubeconfig) as admin:
        got = admin.get(LEASE)
    if got.status_code != 200:
        return None
    return dt.datetime.fromisoformat(got.json()["spec"]["renewTime"].replace("Z", "+00:00"))


@pytest.mark.slow
def test_the_node_agent_rotates_its_certificate_without_a_restart(
    short_lived: MasterProcess, tmp_path: Path
) -> None:
    ca = Pki.at(short_lived.state_dir / "pki").ca_pem()
    kubeconfig = tmp_path / "node.kubeconfig"
    config = ClientConfig(short_lived.server, ca, bootstrap_token(short_lived.state_dir))
    asyncio.run(bootstrap_node(config, NODE, tmp_path / "node.key", kubeconfig, timeout=30))
    first = certificate_in(kubeconfig)
    log_path = tmp_path / "agent.log"
    env = {**os.environ, "PODNET_NODE_LEASE_SECONDS": "8"}  # a renewal every 2 s
    with open(log_path, "ab") as log:
        agent = subprocess.Popen(
            agent_command(tmp_path / "agent", kubeconfig),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:

        def logged(text: str) -> re.Match[str] | None:
            assert agent.poll() is None, log_path.read_text()[-4000:]
            return re.search(text, log_path.read_text())

        wait_for(lambda: logged(f"node {NODE} ready"), 60, "the agent ready")
        port = int(wait_for(lambda: logged(r"metrics on http://127.0.0.1:(\d+)/"), 10).group(1))
        wait_for(lambda: logged("rotated:"), 80, "the rotation", interval=0.5)
        second = certificate_in(kubeconfig)
        assert second.serial_number != first.serial_number
        assert kubeconfig.stat().st_mode & 0o777 == 0o600
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        expiry = re.search(rf"^{EXPIRY} (\S+)$", metrics, re.M)
        assert expiry is not None, metrics
        assert float(expiry.group(1)) >= second.not_valid_after_utc.timestamp()

        # the Lease is still renewed after the first certificate's end, by the same process
        end = first.not_valid_after_utc + dt.timedelta(seconds=3)
        wait_for(lambda: (renewed_at(short_lived) or end) > end, 40, "a renewal after the end")
        assert agent.poll() is None
        text = log_path.read_text()
        assert text.count(f"node {NODE} ready") == 1
        assert "Unauthorized" not in text and "has expired" not in text, text[-4000:]
    finally:
        stop_process(agent)
