"""A DNS flood from one pod is dropped by the kernel, per source, before the DNS socket
(issue 19, finding 5), against the real kernel in lab namespaces only.

A node set up with a DNS rate of ``QPS`` queries a second per source; a receiver bound
to the gateway's port 53 stands in for the DNS (it counts what reaches the socket). One
pod sends ``FLOOD`` datagrams as fast as it can while another pod sends ``PACED`` at its
rate: the flooder gets through no more than its burst and its rate over the time it
sent, the other pod gets every datagram through, and the data plane's own check sees no
drift in the table the meter has filled. Before the meter, all of the flood reached the
socket, whose queue every pod shares.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from podnet import netns
from podnet.testing.dataplanes import Harness
from podnet.testing.harnesses import opened
from podnet.testing.vxlan import Receiver

pytestmark = [pytest.mark.root]

QPS, BURST = 100, 200
FLOOD, PACED = 4000, 40  # the paced pod sends at a quarter of the rate

SENDER = """
import socket, sys, time
to, count, interval, payload = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
start = time.monotonic()
for _ in range(count):
    sock.sendto(payload.encode(), (to, 53))
    if interval:
        time.sleep(interval)
print(time.monotonic() - start)
"""


def send(ns: str, to: str, count: int, interval: float, payload: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", SENDER, to, str(count), str(interval), payload]
    return subprocess.Popen(netns.command(ns, argv), stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("dataplane", ["linux", "ovs"])
async def test_a_flooding_pod_is_held_to_its_rate_and_another_pod_gets_through(
    dataplane: str, tmp_path: Path
) -> None:
    async with opened(dataplane, tmp_path) as harness:
        await flood_and_count(harness)


async def flood_and_count(harness: Harness) -> None:
    network = harness.network(dns_client_qps=float(QPS), dns_client_burst=BURST)
    plane = harness.plane
    await plane.setup_node(network)
    flooder, paced = harness.pod(10, "flood"), harness.pod(11, "paced")
    for pod in (flooder, paced):
        await plane.attach_pod(pod)
    flooder_ns, paced_ns = Path(flooder.netns).name, Path(paced.netns).name
    gateway, node_ns = str(network.gateway.ip), harness.lab.node_ns(1)

    receiver = Receiver(node_ns, 53, stop="control", seconds=30)
    flood = send(flooder_ns, gateway, FLOOD, 0.0, "flood")
    steady = send(paced_ns, gateway, PACED, 4.0 / QPS, "paced")
    flood_seconds = float(flood.communicate(timeout=60)[0])
    steady.communicate(timeout=60)
    send(paced_ns, gateway, 1, 0.0, "control").communicate(timeout=30)
    seen = Counter(line.split(" ", 1)[1] for line in receiver.lines())

    assert seen["paced"] == PACED, seen
    allowed = BURST + QPS * (flood_seconds + 1.0)
    assert BURST <= seen["flood"] <= allowed < FLOOD, (seen, flood_seconds)
    status = await plane.check_node(network)
    assert status.ok, status.problems
    listed = netns.run(node_ns, ["nft", "list", "set", "inet", "podnet", "dns_clients"])
    assert str(flooder.address.ip) in listed.stdout, listed.stdout
