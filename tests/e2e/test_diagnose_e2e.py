"""Attack: the support bundle (``podnet adm diagnose``) holds no secret of the cluster.

A real one-node cluster (etcd, master, agent, relays). Before the bundle is taken, secrets
are planted where a careless daemon or user could leave them: the admin token, the node
token and a whole private key appended to the master's log (bare, as a Bearer header and
as a key's body lines alone), and the node token as an annotation of a Namespace. Then
the command runs as a user runs it (``python -m podnet adm diagnose``), and every member of
the archive is scanned for every token of every tokens file and kubeconfig under the state
directory and every PEM private key there (the exact block, and each base64 body line).
The secrets are found by this test's own reading of the files, not by the code under test.
"""

from __future__ import annotations

import base64
import os
import re
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from podnet.cluster import lifecycle, pods
from podnet.model.kinds import KINDS, NAMESPACE
from podnet.testing.e2e import TEST_DATAPLANE

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?-----END [A-Z0-9 ]*PRIVATE KEY-----", re.S
)
LEAK = "diag-leak"


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("pn-diag")
    try:
        lifecycle.cluster_up(
            directory, lifecycle.ClusterSpec(nodes=1, dataplane=TEST_DATAPLANE), say=print
        )
        yield directory
    finally:
        lifecycle.cluster_down(directory, say=print)


def cluster_secrets(state_dir: Path) -> tuple[set[str], set[str]]:
    """(tokens, private-key forms) of every file under the state directory."""
    tokens: set[str] = set()
    keys: set[str] = set()
    for path in state_dir.rglob("*"):
        if not path.is_file() or path.is_symlink() or path.stat().st_size > 1 << 20:
            continue
        text = path.read_bytes().decode(errors="replace")
        if path.name == "tokens.csv":
            tokens |= {line.split(",")[0] for line in text.splitlines() if line.strip()}
        if "kubeconfig" in path.name:
            for user in yaml.safe_load(text).get("users") or []:
                for field in ("token", "client-key-data"):
                    if user["user"].get(field):
                        tokens.add(user["user"][field])
        for block in PEM.findall(text):
            keys.add(block)
            keys |= {line for line in block.splitlines()[1:-1] if len(line) >= 16}
    return tokens, keys


def plant(state_dir: Path, tokens: set[str], keys: set[str]) -> None:
    """Secrets where a bundle would copy them from: the master's log and an object."""
    admin = yaml.safe_load((state_dir / "master" / "admin.kubeconfig").read_text())
    node = yaml.safe_load((state_dir / "nodes" / "node1" / "node.kubeconfig").read_text())
    admin_token = admin["users"][0]["user"]["token"]
    node_token = node["users"][0]["user"]["token"]
    key = (state_dir / "etcd-pki" / "ca.key").read_text()
    body = key.splitlines()[1]
    with (state_dir / "master" / "master.log").open("a") as log:
        log.write(f"{LEAK} Authorization: Bearer {admin_token}\n")
        log.write(f"{LEAK} bare node token {node_token} in a message\n")
        log.write(f"{LEAK} a key logged whole:\n{key}")
        log.write(f"{LEAK} a key's body line alone: {body}\n")
    with pods.admin_api(state_dir) as api:
        meta = {"name": LEAK, "annotations": {"example.com/oops": node_token}}
        api.create(NAMESPACE, {"metadata": meta})


def run_diagnose(state_dir: Path, out: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "podnet", "adm", "diagnose", "-o", str(out)]
    env = {**os.environ, "PODNET_STATE_DIR": str(state_dir)}
    env.pop("KUBECONFIG", None)
    return subprocess.run(
        [*argv, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive, "r:gz") as tar:
        found = {}
        for info in tar.getmembers():
            assert info.isfile(), info.name
            data = tar.extractfile(info)
            assert data is not None
            found[info.name.removeprefix("podnet-diagnose/")] = data.read()
        return found


def test_bundle_holds_every_part_and_no_secret(state_dir: Path, tmp_path: Path) -> None:
    tokens, keys = cluster_secrets(state_dir)
    # not a vacuous scan: the admin and node tokens, and keys of the API and etcd PKIs
    assert len(tokens) >= 2 and sum(1 for k in keys if k.startswith("-----BEGIN")) >= 4
    plant(state_dir, tokens, keys)
    out = tmp_path / "bundle.tar.gz"
    done = run_diagnose(state_dir, out)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["bundle.tar.gz"]  # no temporary left
    found = members(out)

    for name, data in found.items():
        assert not name.endswith((".key", ".kubeconfig", "tokens.csv")), name
        for secret in tokens | keys:
            assert secret.encode() not in data, f"{name} holds a secret: {secret[:12]}..."
            encoded = base64.b64encode(secret.encode())
            assert encoded not in data, f"{name} holds a base64 secret"
        assert not re.search(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----", data), name

    # the planted lines are there, with their secrets replaced
    master_log = found["logs/master/master.log"].decode()
    assert master_log.count(LEAK) == 4 and "REDACTED" in master_log
    assert LEAK in found["objects/namespaces.yaml"].decode()

    # every part: a log per daemon, every kind, the node's network, cluster status
    for log in (
        "logs/etcd1/etcd.log",
        "logs/master/master.log",
        "logs/nodes/node1/agent.log",
        "logs/nodes/node1/relay.log",
    ):
        assert found[log].strip(), log
    for kind in KINDS.kinds:
        assert f"objects/{kind.plural}.yaml" in found, kind.plural
    assert "node1" in found["objects/nodes.yaml"].decode()
    ruleset = found["nodes/node1/nft-ruleset.txt"].decode()
    assert "table " in ruleset and "chain " in ruleset
    if TEST_DATAPLANE == "ovs":
        assert "actions=" in found["nodes/node1/ovs-flows.txt"].decode()
    assert "default" in found["nodes/node1/ip-route.txt"].decode()
    assert "vxlan" in found["nodes/node1/ip-link.txt"].decode() or TEST_DATAPLANE == "ovs"
    status = found["cluster-status.txt"].decode()
    assert "node1" in status and "control plane: healthy" in status
    assert found["errors.txt"] == b"no errors\n"
    assert "MANIFEST.txt" in found and "state.json" in found
