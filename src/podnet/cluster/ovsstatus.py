"""What ``cluster status`` shows of a node's data plane, and of its Open vSwitch.

For an ``ovs`` node it asks the node's own instance, from the root namespace, through
its unix sockets (OVSDB and OpenFlow sockets are files; no namespace needs entering):
which daemons run (by pidfile, checked to be this instance's), the version
``ovs-vswitchd`` reports on its control socket, and how many flows br0 holds. A node
whose ``ovs-vswitchd`` is down says so, and is not counted healthy.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from podnet.cluster.ovsnodes import node_ovs_base, running
from podnet.dataplane.interface import DataPlaneError
from podnet.dataplane.ovs.instance import DAEMONS, VSWITCHD, OvsPaths
from podnet.dataplane.ovs.ofctl import OfctlRunner
from podnet.dataplane.ovs.tables import BRIDGE

QUERY_TIMEOUT = 3.0  # seconds for each question to a node's ovs-vswitchd


@dataclass(frozen=True)
class DataPlaneStatus:
    """A node's data plane as ``cluster status`` prints it."""

    dataplane: str
    daemons: dict[str, int] = field(default_factory=dict)  # running OVS daemons: PIDs
    version: str | None = None
    flows: int | None = None  # in br0
    problem: str | None = None

    @property
    def healthy(self) -> bool:
        return self.problem is None

    def text(self) -> str:
        """One line: ``ovs 3.1.0, br0 43 flows (ovsdb-server pid 1, ovs-vswitchd pid 2)``."""
        if self.dataplane != "ovs":
            return self.dataplane
        pids = ", ".join(f"{d} pid {self.daemons[d]}" for d in DAEMONS if d in self.daemons)
        if self.problem is not None:
            return f"ovs {self.problem}" + (f" ({pids})" if pids else "")
        return f"ovs {self.version}, {BRIDGE} {self.flows} flows ({pids})"


def flow_count(dump: str) -> int:
    """The flows in an ``ovs-ofctl dump-flows`` reply (one per line with actions)."""
    return sum(
        1 for line in dump.splitlines() if " actions=" in line or line.startswith("actions=")
    )


def vswitchd_version(reply: str) -> str:
    """``3.1.0`` from ``ovs-vswitchd (Open vSwitch) 3.1.0``."""
    words = reply.split()
    return words[-1] if words else "?"


async def _ask(paths: OvsPaths) -> tuple[str, int]:
    runner = OfctlRunner(paths, timeout=QUERY_TIMEOUT)
    version = vswitchd_version(await runner.appctl("version"))
    return version, flow_count(await runner.dump_flows(BRIDGE))


def ovs_status(base: Path) -> DataPlaneStatus:
    """The status of the OVS instance under ``base``."""
    daemons = running(base)
    down = [daemon for daemon in DAEMONS if daemon not in daemons]
    if down:
        return DataPlaneStatus("ovs", daemons, problem=" and ".join(down) + " DOWN")
    try:
        version, flows = asyncio.run(_ask(OvsPaths(base)))
    except DataPlaneError as exc:
        return DataPlaneStatus("ovs", daemons, problem=f"{VSWITCHD} not answering: {exc}")
    return DataPlaneStatus("ovs", daemons, version, flows)


def node_dataplane_status(state_dir: Path, dataplane: str, node: str) -> DataPlaneStatus:
    """The data plane of ``node`` in the cluster at ``state_dir``."""
    if dataplane != "ovs":
        return DataPlaneStatus(dataplane)
    return ovs_status(node_ovs_base(state_dir, node))
