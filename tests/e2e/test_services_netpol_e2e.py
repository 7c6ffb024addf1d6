"""NetworkPolicy through cluster IPs on a real local cluster: the policy applies to the
backend pod after DNAT (its target port, not the Service's), as in Kubernetes, whose
NetworkPolicy e2e suite probes every pod through a ClusterIP. Each case's matrix is
decided by real traffic through the cluster IPs, and ``podnet trace`` through the same
Services must agree with it for every pair.

One 3-node cluster (networkpolicy plugin) for the module, torn down in a finalizer even
when a test fails. Pods x/a, x/b, y/a, y/b spread over the nodes, each behind its own
Service, port 80 to the echo server's 8080 (``podnet.testing.servicematrix``). Each case
removes its policies again, so the cases do not depend on each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podnet.cluster import pods
from podnet.model.kinds import NETWORK_POLICY
from podnet.testing import servicematrix

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

NODES = 3
PODS = ["x/a", "x/b", "y/a", "y/b"]
SETTLE = 30.0


def policy(name: str, selector: dict[str, str], ingress: list[Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress"]}
    if ingress is not None:
        spec["ingress"] = ingress
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": "x"},
        "spec": spec,
    }


DENY_X = policy("deny", {}, None)
FROM_Y = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}
CASES = {
    "no policy": ([], "x/a 1111\nx/b 1111\ny/a 1111\ny/b 1111"),
    "x denies all ingress": ([DENY_X], "x/a 1011\nx/b 0111\ny/a 0011\ny/b 0011"),
    "x admits namespace y on the target port": (
        [DENY_X, policy("from-y", {}, [{"from": [FROM_Y], "ports": [{"port": 8080}]}])],
        "x/a 1011\nx/b 0111\ny/a 1111\ny/b 1111",
    ),
    "a rule on the service port admits nothing (policy sees the target port)": (
        [DENY_X, policy("from-y", {}, [{"from": [FROM_Y], "ports": [{"port": 80}]}])],
        "x/a 1011\nx/b 0111\ny/a 0011\ny/b 0011",
    ),
    "x/b admits x/a by pod selector": (
        [DENY_X, policy("a-to-b", {"app": "b"}, [{"from": [{"podSelector": {
            "matchLabels": {"app": "a"}}}]}])],
        "x/a 1111\nx/b 0111\ny/a 0011\ny/b 0011",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state_dir = tmp_path_factory.mktemp("pn-svc-np")
    with servicematrix.matrix_cluster(state_dir, "networkpolicy", PODS, NODES):
        yield state_dir


@pytest.mark.parametrize("case", list(CASES))
def test_policy_through_cluster_ips_matches_trace_and_expectation(cluster: Path, case: str) -> None:
    policies, expected = CASES[case]
    with pods.admin_api(cluster) as api:
        for body in policies:
            api.create(NETWORK_POLICY, body, namespace="x")
    try:
        servicematrix.matrix_becomes(cluster, PODS, expected, SETTLE)
    finally:
        with pods.admin_api(cluster) as api:
            for body in policies:
                api.delete(NETWORK_POLICY, "x", body["metadata"]["name"])
