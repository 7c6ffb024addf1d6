"""The ``ovs`` harness of the data plane contract tests (``podnet.testing.dataplanes``):
node 1 of a lab, as for ``linux``, with the node's own OVS daemons under the state dir,
stopped by PID at the end. The views read the kernel as for linux, and br0 with
``ovs-ofctl``/``ovs-vsctl`` (never through the plane's own code)."""

from __future__ import annotations

import re
import shutil
import subprocess
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

from podnet.dataplane.interface import PodNetwork, RemoteNode
from podnet.dataplane.ovs.daemons import OvsPaths, stop_instance
from podnet.dataplane.wiring import host_veth_name
from podnet.testing.dataplanes import LinuxHarness, json_output, snapshot
from podnet.testing.lab import Lab, sh


class OvsHarness(LinuxHarness):
    """``ovs``: node 1 of a lab, with the node's own OVS daemons under the state dir
    (stopped by PID at the end); the views read the kernel as for linux, and br0 with
    ``ovs-ofctl``/``ovs-vsctl`` (not through the plane's own code)."""

    name = "ovs"

    def __init__(self, lab: Lab, state_dir: Path) -> None:
        # OVS's unix sockets live under the state dir and must fit in 107 bytes: a short
        # directory of this run's own instead of the test's tmp_path
        super().__init__(lab, Path("/tmp") / lab.run)

    @property
    def paths(self) -> OvsPaths:
        return OvsPaths((self.state_dir / "ovs").absolute())

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            try:
                stop_instance(self.paths.base, remove=True)
            finally:
                shutil.rmtree(self.state_dir, ignore_errors=True)

    def ovs(self, *argv: str) -> str:
        """``ovs-ofctl``/``ovs-vsctl`` on this node's instance ("" while it has none)."""
        if not (self.paths.db_socket.exists() and self.paths.mgmt("br0").exists()):
            return ""
        tool = shutil.which(argv[0]) or argv[0]
        extra = ["-O", "OpenFlow13", "--no-names", "--no-stats"] if argv[0] == "ovs-ofctl" else []
        if argv[0] == "ovs-vsctl":
            extra = [f"--db=unix:{self.paths.db_socket}"]
        if argv[1] != "dump-flows":
            extra = [e for e in extra if e != "--no-stats"]
        done = subprocess.run(
            [tool, *extra, *argv[1:]],
            capture_output=True,
            text=True,
            env=self.paths.env(),
            timeout=30,
        )
        assert done.returncode == 0, f"{argv}: {done.stderr}"
        return done.stdout

    def flows(self, *tables: int) -> list[str]:
        """br0's flows (of ``tables``), as ``dump-flows`` shows them."""
        lines = self.ovs("ovs-ofctl", "dump-flows", "br0").splitlines()
        return [
            line.strip()
            for line in lines
            if "actions=" in line and (not tables or _table_of(line) in tables)
        ]

    async def remote_routes(self) -> dict[IPv4Network, IPv4Address]:
        found = {}
        for line in self.flows(90):
            dst, node = (
                re.search(r"nw_dst=(\S+?)[ ,]", line),
                re.search(r"set_field:(\S+)->tun_dst", line),
            )
            if dst and node:
                found[IPv4Network(dst.group(1))] = IPv4Address(node.group(1))
        for route in json_output(self.ns, "ip", "route", "show", "proto", "80"):
            if "gateway" in route:  # host-gw: via the remote node on the underlay
                found[IPv4Network(route["dst"])] = IPv4Address(route["gateway"])
        return found

    async def leftovers(self, pod: PodNetwork) -> list[str]:
        host = host_veth_name(pod.container_id, pod.ifname)
        ip = str(pod.address.ip)
        places = {
            "link": host in sh(self.ns, "ip", "link"),
            "br0's ports": host in self.ovs("ovs-vsctl", "list-ports", "br0").split(),
            "br0's pod flows": any(
                f"={ip}," in line or line.endswith(f"={ip}") for line in self.flows(20, 40, 70)
            ),
        }
        return [f"{host} in {where}" for where, held in places.items() if held]

    async def policy_in_force(self) -> bool:
        """Whether tables 21/80 drop any new traffic (networkpolicy always drops a reply
        that did not come back the way its connection went)."""
        return any(
            "drop" in line.split("actions=")[1] and "+rpl" not in line
            for line in self.flows(21, 80)
        )

    async def snapshot(self) -> Any:
        ports = self.ovs(
            "ovs-vsctl",
            "--format=csv",
            "--columns=_uuid,name,ofport,external_ids",
            "list",
            "Interface",
        )
        return (*snapshot(self.ns), "\n".join(sorted(self.flows())), ports)

    async def drift_node(self) -> None:
        self.ovs("ovs-ofctl", "del-flows", "br0", "table=30")

    async def drift_remote(self, remote: RemoteNode) -> None:
        routes = json_output(self.ns, "ip", "route", "show", "proto", "80")
        if any(r["dst"] == str(remote.subnet) for r in routes):  # host-gw: the host's route
            await super().drift_remote(remote)
        else:  # vxlan: the flow to its subnet
            self.ovs("ovs-ofctl", "del-flows", "br0", f"table=90,ip,nw_dst={remote.subnet}")


def _table_of(line: str) -> int:
    found = re.search(r"table=(\d+)", line)
    return int(found.group(1)) if found else 0
