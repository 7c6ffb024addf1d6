"""Egress objects podnet does not enforce are never a silent yes (issue 21): with the real
kubectl, an EgressNetworkPolicy with a dnsName rule (names match no address yet) is
answered with a warning, stored with ``Enforced=False`` (whatever status the manifest
claimed) and a Warning Event; one of CIDR rules only is ``Enforced=True`` with no
warning; a second policy in a project is refused; egress IPs on a NetNamespace or a
HostSubnet get the warning and the Event too."""

from __future__ import annotations

import json
from pathlib import Path

from podnet.api.egressnotice import EVENT_REASON
from podnet.testing.cli import run_kubectl
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess

POLICY = """\
apiVersion: v1
kind: Namespace
metadata: {name: egress-a}
---
apiVersion: network.openshift.io/v1
kind: EgressNetworkPolicy
metadata: {name: default, namespace: egress-a}
spec:
  egress:
  - type: Allow
    to: {dnsName: www.example.com}
  - type: Deny
    to: {cidrSelector: 0.0.0.0/0}
status:
  conditions: [{type: Enforced, status: "True", reason: Claimed, message: forged}]
"""


def events(master: MasterProcess, namespace: str) -> list[dict[str, object]]:
    found = run_kubectl(master.kubeconfig, "get", "events", "-n", namespace, "-o", "json")
    assert found.returncode == 0, found.stderr
    items = json.loads(found.stdout)["items"]
    return [e for e in items if e.get("reason") == EVENT_REASON]


def test_an_egress_firewall_is_stored_as_not_enforced_and_said_so(
    master: MasterProcess, tmp_path: Path
) -> None:
    manifest = tmp_path / "policy.yaml"
    manifest.write_text(POLICY)
    applied = run_kubectl(master.kubeconfig, "apply", "-f", str(manifest))
    assert applied.returncode == 0, applied.stderr
    assert "Warning: cidrSelector rules are enforced, but dnsName rules" in applied.stderr
    got = run_kubectl(
        master.kubeconfig, "get", "egressnetworkpolicy", "default", "-n", "egress-a", "-o", "json"
    )
    (condition,) = json.loads(got.stdout)["status"]["conditions"]
    assert (condition["type"], condition["status"]) == ("Enforced", "False")
    assert condition["reason"] == "DNSNamesNotSupported", condition
    found = wait_for(lambda: events(master, "egress-a") or None, 10, "the Warning Event")
    assert found[0]["involvedObject"]["kind"] == "EgressNetworkPolicy"
    assert found[0]["type"] == "Warning"
    second = POLICY.split("---\n")[1].replace("name: default", "name: second")
    manifest.write_text(second)
    refused = run_kubectl(master.kubeconfig, "create", "-f", str(manifest))
    assert refused.returncode != 0 and "one per project" in refused.stderr, refused.stderr
    cidrs_only = POLICY.split("---\n")[1].replace(
        "dnsName: www.example.com", "cidrSelector: 192.0.2.0/24"
    )
    manifest.write_text(cidrs_only)
    replaced = run_kubectl(master.kubeconfig, "apply", "-f", str(manifest))
    assert replaced.returncode == 0 and "Warning" not in replaced.stderr, replaced.stderr
    got = run_kubectl(
        master.kubeconfig, "get", "egressnetworkpolicy", "default", "-n", "egress-a", "-o", "json"
    )
    (condition,) = json.loads(got.stdout)["status"]["conditions"]
    assert (condition["status"], condition["reason"]) == ("True", "Enforced")


def test_egress_ips_are_stored_with_a_warning_and_an_event(master: MasterProcess) -> None:
    made = run_kubectl(master.kubeconfig, "create", "namespace", "egress-b")
    assert made.returncode == 0, made.stderr
    netns = wait_for(
        lambda: (
            run_kubectl(master.kubeconfig, "get", "netnamespace", "egress-b").returncode == 0
            or None
        ),
        20,
        "the NetNamespace",
    )
    assert netns
    patch = '{"egressIPs": ["192.0.2.50"]}'
    patched = run_kubectl(
        master.kubeconfig, "patch", "netnamespace", "egress-b", "--type=merge", "-p", patch
    )
    assert patched.returncode == 0, patched.stderr
    assert "Warning: podnet does not implement egress IPs yet" in patched.stderr
    found = wait_for(lambda: events(master, "default") or None, 10, "the Warning Event")
    assert any(e["involvedObject"]["name"] == "egress-b" for e in found)
    plain = run_kubectl(master.kubeconfig, "label", "netnamespace", "egress-b", "x=y")
    assert plain.returncode == 0 and "Warning" in plain.stderr  # egressIPs still stored
