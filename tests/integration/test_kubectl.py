"""The real kubectl (1.32) against the master, with the kubeconfig the master wrote."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from podnet.testing.cli import KUBECTL, run_kubectl
from podnet.testing.e2e import Lines, wait_for
from podnet.testing.processes import MasterProcess

pytestmark = pytest.mark.usefixtures("kubectl")

MANIFEST = """
apiVersion: v1
kind: Namespace
metadata:
  name: team-a
  labels: {team: a}
---
apiVersion: v1
kind: Node
metadata:
  name: worker-1
status:
  addresses: [{type: InternalIP, address: 192.0.2.11}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: deny-all
  namespace: team-a
spec:
  podSelector: {}
  policyTypes: [Ingress]
---
apiVersion: network.openshift.io/v1
kind: EgressNetworkPolicy
metadata:
  name: default
  namespace: team-a
spec:
  egress:
  - type: Deny
    to: {cidrSelector: 0.0.0.0/0}
"""


def wait_output(master: MasterProcess, args: list[str], needle: str, timeout: float = 20) -> str:
    def output() -> str | None:
        result = run_kubectl(master.kubeconfig, *args)
        return result.stdout + result.stderr if needle in result.stdout + result.stderr else None

    return str(wait_for(output, timeout, f"{needle!r} in kubectl {' '.join(args)}"))


def test_kubectl_create_get_describe_delete(master: MasterProcess, tmp_path: Path) -> None:
    manifest = tmp_path / "objects.yaml"
    manifest.write_text(MANIFEST)
    created = run_kubectl(master.kubeconfig, "create", "-f", str(manifest))
    assert created.returncode == 0, created.stderr
    assert "namespace/team-a created" in created.stdout
    assert "networkpolicy.networking.k8s.io/deny-all created" in created.stdout

    table = wait_output(master, ["get", "hostsubnets"], "worker-1")
    header = table.splitlines()[0].split()
    assert header[:5] == ["NAME", "HOST", "HOST", "IP", "SUBNET"]
    assert "192.0.2.11" in table and "10.12" in table

    netns = wait_output(master, ["get", "netnamespaces"], "team-a")
    assert netns.splitlines()[0].split()[:2] == ["NAME", "NETID"]

    as_yaml = run_kubectl(master.kubeconfig, "get", "hostsubnet", "worker-1", "-o", "yaml")
    assert as_yaml.returncode == 0, as_yaml.stderr
    obj = yaml.safe_load(as_yaml.stdout)
    assert obj["kind"] == "HostSubnet" and obj["hostIP"] == "192.0.2.11"

    as_json = run_kubectl(master.kubeconfig, "get", "netpol", "-n", "team-a", "-o", "json")
    assert json.loads(as_json.stdout)["items"][0]["metadata"]["name"] == "deny-all"

    described = run_kubectl(master.kubeconfig, "describe", "hostsubnet", "worker-1")
    assert described.returncode == 0, described.stderr
    assert "worker-1" in described.stdout and "192.0.2.11" in described.stdout

    described = run_kubectl(master.kubeconfig, "describe", "node", "worker-1")
    assert described.returncode == 0, described.stderr

    # The Namespace comes first in the file, so its finalization may delete the policies
    # before kubectl reaches them (as in Kubernetes): tolerate NotFound, then check.
    deleted = run_kubectl(master.kubeconfig, "delete", "--ignore-not-found", "-f", str(manifest))
    assert deleted.returncode == 0, deleted.stderr
    assert 'namespace "team-a" deleted' in deleted.stdout
    for kind, extra in (("namespace", []), ("node", []), ("netpol", ["-n", "team-a"])):
        name = {"namespace": "team-a", "node": "worker-1", "netpol": "deny-all"}[kind]
        gone = run_kubectl(master.kubeconfig, "get", kind, name, *extra)
        assert gone.returncode != 0 and "NotFound" in gone.stderr, (kind, gone.stdout)


def test_kubectl_watch_sees_new_objects(master: MasterProcess) -> None:
    env_cmd = [
        KUBECTL,
        f"--cache-dir={master.kubeconfig.parent / 'kc'}",
        f"--kubeconfig={master.kubeconfig}",
        "get",
        "namespaces",
        "-w",
    ]
    watcher = subprocess.Popen(env_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert watcher.stdout is not None
    lines = Lines(watcher.stdout)
    try:
        # The listing is printed first; the watch starts from its resourceVersion, so an
        # object made after this line is seen however soon the watch connects.
        lines.wait_for("default")
        made = run_kubectl(
            master.kubeconfig,
            "create",
            "-f",
            "-",
            stdin="apiVersion: v1\nkind: Namespace\nmetadata: {name: watched}\n",
        )
        assert made.returncode == 0, made.stderr
        assert lines.wait_for("watched").split()[:2] == ["watched", "Active"]
    finally:
        watcher.terminate()
        _, err = watcher.communicate(timeout=10)
    assert "error" not in err.lower(), err
