"""``podnet node`` without ``--node-ip`` on a host with a default route (issue 20), in a lab
network namespace: the agent picks the default-route interface's address, not the first
global one, and starts (before the fix it died at start with ``RuntimeError: This event
loop is already running``). The namespace is made and removed by its exact name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from podnet import netns
from podnet.kubeconfig import write_kubeconfig
from podnet.testing.e2e import wait_for
from podnet.testing.lab import ip

pytestmark = [pytest.mark.root]  # root, nft and ip are required (tests/conftest.py)

OTHER = "203.0.113.5/24"  # TEST-NET-3, on the first interface: not the default route's
UPLINK = "198.51.100.7/24"  # TEST-NET-2, on the default route's interface
GATEWAY = "198.51.100.1"


@pytest.fixture
def host() -> Iterator[str]:
    """A "host": two interfaces (veth pairs kept inside it), the second holding the
    default route."""
    name = f"pnip-{uuid.uuid4().hex[:8]}"
    netns.create(name)
    try:
        for device, address in (("d0", OTHER), ("d1", UPLINK)):
            ip(name, f"link add {device} type veth peer name {device}p")
            ip(name, f"addr add {address} dev {device}")
            ip(name, f"link set {device}p up")
            ip(name, f"link set {device} up")
        ip(name, f"route add default via {GATEWAY} dev d1")
        yield name
    finally:
        netns.remove(name)


def node_log_until(name: str, tmp_path: Path, needle: str, timeout: float = 30.0) -> str:
    """Run ``podnet node`` as the unit does (no ``--node-ip``) inside ``name`` until its
    log holds ``needle`` or it exits; then SIGTERM it (by PID) and return the log."""
    kubeconfig = tmp_path / "node.kubeconfig"
    write_kubeconfig(kubeconfig, "https://127.0.0.1:1", b"", "token", user="system:node:h1")
    argv = [
        *(sys.executable, "-m", "podnet", "--kubeconfig", str(kubeconfig), "node"),
        *("--node-name", "h1", "--dataplane", "fake", "--no-dns"),
        *("--state-dir", str(tmp_path / "state"), "--ipam-dir", str(tmp_path / "ipam")),
        *("--cni-bin-dir", str(tmp_path / "bin"), "--cni-conf-dir", str(tmp_path / "net.d")),
        *("--socket", str(tmp_path / "cni.sock")),
    ]
    log_path = tmp_path / "node.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            netns.command(name, argv), stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path
        )
    try:
        wait_for(
            lambda: needle in log_path.read_text() or process.poll() is not None,
            timeout,
            f"{needle!r} in the node's log",
            interval=0.05,
        )
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return log_path.read_text()


def test_podnet_node_detects_the_default_route_address(host: str, tmp_path: Path) -> None:
    log = node_log_until(host, tmp_path, "node IP ")
    assert "already running" not in log, log
    assert "node IP 198.51.100.7 (detected)" in log, log


def test_without_a_default_route_the_first_global_address(host: str, tmp_path: Path) -> None:
    ip(host, "route del default")
    log = node_log_until(host, tmp_path, "node IP ")
    assert "node IP 203.0.113.5 (detected)" in log, log
