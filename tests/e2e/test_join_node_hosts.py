"""`podnet adm init` and `podnet adm join node` on hand-made hosts
(``podnet.testing.hosts``), as an operator runs them: no flag beyond the documented ones,
each host's own /etc/podnet and /etc/systemd/system, and the units they installed
started by their ExecStart lines, as their User, with the environment files they wrote.
m1 becomes the first master (etcd on TLS, the master); n1 joins: a wrong CA hash is
refused with nothing written, then it gets a client certificate through a CSR, its relay
the master's address, and goes Ready.

The bootstrap tokens come from `podnet adm token create` on m1; one bound to another node
is refused its certificate.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from podnet.api.clusterinfo import ca_cert_hash
from podnet.deploy import parse_env
from podnet.testing.hosts import Host, Hosts

pytestmark = [pytest.mark.root, pytest.mark.slow]

BIN = str(Path(sys.executable).parent)
MASTER_DIR = "/var/lib/podnet/master"
ADMIN = {"KUBECONFIG": f"{MASTER_DIR}/admin.kubeconfig"}
PATH = {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin"}
READY = (  # reads a Node as JSON on stdin: exit 0 when it is Ready
    'import json,sys; c=json.load(sys.stdin)["status"].get("conditions") or []; '
    'sys.exit(0 if any(x["type"]=="Ready" and x["status"]=="True" for x in c) else 1)'
)


def wait(host: Host, check: str, seconds: float, what: str) -> None:
    host.wait_until(check, seconds, what, PATH)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Host, Host]]:
    with Hosts(f"pj{uuid.uuid4().hex[:6]}", tmp_path) as hosts:
        m1, n1 = hosts.add("m1", 21), hosts.add("n1", 31)
        out = m1.sh("podnet adm init --advertise-address 10.0.0.21", PATH).stdout
        assert "systemd does not run this host" in out and "CA hash: sha256:" in out, out
        for unit in ("podnet-etcd.service", "podnet-master.service"):
            start_unit(m1, unit)
        wait(m1, "curl -skf https://10.0.0.21:6443/readyz >/dev/null", 60, "the master ready")
        yield m1, n1


def join_command(token: str, ca_hash: str) -> str:
    return (
        "podnet adm join node --server https://10.0.0.21:6443 "
        f"--token {token} --ca-cert-hash {ca_hash}"
    )


def start_unit(host: Host, name: str) -> None:
    host.start_unit(name, BIN)  # the venv stands for the guide's /opt/podnet


def test_a_host_joins_as_a_node_and_goes_ready(lab: tuple[Host, Host]) -> None:
    m1, n1 = lab
    ca_hash = ca_cert_hash(m1.sh(f"cat {MASTER_DIR}/pki/ca.crt").stdout.encode())
    token = m1.sh("podnet adm token create --node n1 --ttl 10m", PATH).stdout.strip()
    other = m1.sh("podnet adm token create --node n2", PATH).stdout.strip()
    wrong = "sha256:" + ("0" * 64)
    with pytest.raises(AssertionError) as refused:
        n1.sh(join_command(token, wrong), PATH)
    assert "refusing to trust it" in str(refused.value)
    assert n1.sh("test ! -e /etc/podnet && echo clean").stdout == "clean\n"  # nothing written
    refused_for = n1.sh(f"{join_command(other, ca_hash)} 2>&1 || echo refused", PATH).stdout
    assert "not signed" in refused_for and "refused" in refused_for  # bound to n2

    started = time.monotonic()
    out = n1.sh(join_command(token, ca_hash), PATH).stdout
    print(f"join command: {time.monotonic() - started:.1f} s")
    assert "client certificate issued" in out and "systemd does not run this host" in out, out
    mode = n1.sh("stat -c %a /etc/podnet/node.kubeconfig /etc/podnet/node.key").stdout.split()
    assert mode == ["600", "600"]
    kubeconfig = n1.sh("cat /etc/podnet/node.kubeconfig").stdout
    assert token not in kubeconfig and "client-certificate-data" in kubeconfig
    assert "https://127.0.0.1:6443" in kubeconfig  # the local relay
    relay_env = parse_env(n1.sh("cat /etc/podnet/relay.env").stdout)
    assert relay_env == {"RELAY_TARGETS": "--target 10.0.0.21:6443"}
    for unit in ("podnet-api-relay.service", "podnet-node.service"):
        start_unit(n1, unit)
    ready = f"podnet get node n1 -o json 2>/dev/null | python3 -c '{READY}'"
    wait(m1, f"KUBECONFIG={ADMIN['KUBECONFIG']} {ready}", 60, "node n1 Ready")
    print(f"adm join node -> Ready: {time.monotonic() - started:.1f} s")
    node = json.loads(m1.sh("podnet get node n1 -o json", {**PATH, **ADMIN}).stdout)
    addresses = {a["address"] for a in node["status"]["addresses"]}
    assert "10.0.0.31" in addresses  # detected on the default route's link, no --node-ip
    again = n1.sh(f"{join_command(token, ca_hash)} || echo refused", PATH).stdout
    assert "joined already" in again or "refused" in again
