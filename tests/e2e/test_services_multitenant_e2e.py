"""Multitenant isolation through cluster IPs on a real local cluster: a pod reaches a
Service only where it may reach the Service's endpoints, and VNID 0 (``default``) stays
global, before and after ``podnet adm pod-network`` joins, isolates and globalises
projects. Every matrix is decided by real traffic through the cluster IPs, and
``podnet trace`` through the same Services must say the same.

One 3-node cluster (multitenant plugin) for the module, torn down in a finalizer even
when a test fails. Pods a/p1, a/p2, b/p1, b/p2, default/p1 spread over the nodes, each
behind its own Service (``podnet.testing.servicematrix``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from podnet.testing import servicematrix
from podnet.testing.cli import run_podnet

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

NODES = 3
PODS = ["a/p1", "a/p2", "b/p1", "b/p2", "default/p1"]
SETTLE = 30.0
ISOLATED = """\
a/p1 11001
a/p2 11001
b/p1 00111
b/p2 00111
default/p1 11111"""
EVERYONE = "\n".join(f"{key} 11111" for key in PODS)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state_dir = tmp_path_factory.mktemp("pn-svc-mt")
    with servicematrix.matrix_cluster(state_dir, "multitenant", PODS, NODES):
        yield state_dir


def matrix_becomes(state_dir: Path, expected: str) -> None:
    servicematrix.matrix_becomes(state_dir, PODS, expected, SETTLE)


def adm(state_dir: Path, *args: str) -> None:
    admin = state_dir / "master" / "admin.kubeconfig"
    done = run_podnet(admin, "adm", "pod-network", *args)
    assert done.returncode == 0, done.stderr


def test_projects_reach_services_only_where_they_reach_the_endpoints(cluster: Path) -> None:
    matrix_becomes(cluster, ISOLATED)
    adm(cluster, "join-projects", "--to", "a", "b")
    matrix_becomes(cluster, EVERYONE)
    adm(cluster, "isolate-projects", "b")
    matrix_becomes(cluster, ISOLATED)
    adm(cluster, "make-projects-global", "b")
    matrix_becomes(cluster, EVERYONE)
    adm(cluster, "isolate-projects", "b")
    matrix_becomes(cluster, ISOLATED)
