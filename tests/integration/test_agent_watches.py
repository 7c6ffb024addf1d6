"""The agent opens one watch per kind at the master, however many of its loops read it.

Remote nodes, policy (networkpolicy mode: Pods, Namespaces, NetNamespaces,
NetworkPolicies, HostSubnets), the service proxy (Services, EndpointSlices,
HostSubnets), the cluster DNS (Services, EndpointSlices, Pods) and the ClusterNetwork
check all read through the agent's ``client.informers``: counted by the master's
``podnet_apiserver_watchers`` gauge, each kind has exactly one open watch from the agent.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_agent_fake_dataplane import _start_agent

from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess, launch_master

KINDS = (
    "hostsubnets",
    "clusternetworks",
    "pods",
    "namespaces",
    "netnamespaces",
    "networkpolicies",
    "services",
    "endpointslices",
)
GAUGE = re.compile(r'^podnet_apiserver_watchers\{resource="([^"]+)"\} ([0-9.e+]+)$', re.M)


def watchers(master: MasterProcess) -> dict[str, int]:
    """Open watch streams at the master, by resource."""
    with client_for(master.kubeconfig) as api:
        text = api.get("/metrics").text
    return {kind: int(float(count)) for kind, count in GAUGE.findall(text)}


def test_one_watch_per_kind_from_the_agent(etcd: EtcdProcess, tmp_path: Path, prefix: str) -> None:
    master = launch_master(etcd, tmp_path / "master", prefix, "--network-plugin", "networkpolicy")
    running = None
    try:
        before = watchers(master)
        running = _start_agent(master, tmp_path / "agent")
        for line in ("policy rules applied", "services applied", "DNS: pods listed"):
            running.wait_for_log(line)

        def opened() -> dict[str, int] | None:
            now = watchers(master)
            found = {kind: now.get(kind, 0) - before.get(kind, 0) for kind in KINDS}
            return found if all(found.values()) else None

        found = wait_for(opened, 30, "a watch of every kind the agent reads")
        assert found == dict.fromkeys(KINDS, 1), found
    finally:
        if running is not None:
            running.stop()
        master.stop()
