"""The OVSDB side of an ovs node: its daemons, br0 and br0's ports (tun0, vxlan0, pods),
and the comparison of br0's flows with the desired ones.

``problems`` compares and changes nothing (it does not start a daemon that is down);
``ensure`` starts or adopts the daemons and builds what is missing. Pod ports carry the
pod's identity (``ovspods.identity``); a podnet-named port without one, or whose device
is gone, is an orphan of a crash and removed at set-up. The flow comparison is OVS's own
(``ovs-ofctl diff-flows``), so flows compare by meaning, not by how they are written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping

from podnet.dataplane.interface import (
    DataPlaneError,
    NodeNetwork,
    NodeSetupRefused,
    PodAttachment,
    RemoteNode,
)
from podnet.dataplane.ovs import ovspods
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.daemons import DAEMONS, OvsDaemons, binary
from podnet.dataplane.ovs.flow import Flow, flows_text
from podnet.dataplane.ovs.ovsdb import Ovsdb, Port
from podnet.dataplane.ovs.underlay import UNDERLAY_BRIDGE, Underlay
from podnet.dataplane.ovs.underlaysetup import Kernel, Switch, UnderlaySetup
from podnet.dataplane.vteppeers import vtep_peers
from podnet.dataplane.wiring import is_host_veth_name, usable_remotes

DIFF_TIMEOUT = 30.0
SHOWN = 3  # differing flows named in a problem


class NodePorts:
    """One node's daemons and br0 in OVSDB."""

    def __init__(self, daemons: OvsDaemons, switch: Switch, kernel: Kernel) -> None:
        self.daemons, self.switch, self.kernel = daemons, switch, kernel
        self._db: Ovsdb | None = None

    def running(self) -> bool:
        """Whether both daemons run."""
        return all(self.daemons.pid(name) is not None for name in DAEMONS)

    async def connect(self) -> Ovsdb:
        if self._db is None:
            self._db = await Ovsdb.connect(self.daemons.paths.db_socket)
        return self._db

    async def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()

    async def problems(self, node: NodeNetwork) -> list[str]:
        """How the daemons and br0's fixed ports differ from ``node``'s set-up."""
        down = [f"{name} is not running" for name in DAEMONS if self.daemons.pid(name) is None]
        if down:
            return down
        db = await self.connect()
        if await db.bridge_external_ids(t.BRIDGE) is None:
            return [f"{t.BRIDGE} is missing"]
        ports = {port.name: port for port in await db.ports(t.BRIDGE)}
        found = _port_problems(ports.get(t.TUN), t.TUN, "internal", t.TUN_PORT)
        underlay = UnderlaySetup(db, self.switch, self.kernel)
        if node.tunnel == "vxlan":
            try:
                return found + await underlay.check(await self._underlay(underlay, node))
            except NodeSetupRefused as err:
                return [*found, str(err)]
        if t.VXLAN in ports:
            found.append(f"{t.VXLAN} exists but the tunnel is {node.tunnel}")
        if await db.port(UNDERLAY_BRIDGE) is not None:
            found.append(f"{UNDERLAY_BRIDGE} exists but the tunnel is {node.tunnel}")
        return found

    async def ensure(self, node: NodeNetwork) -> None:
        """Daemons, br0 (the datapath found, fail_mode secure, OpenFlow 1.3), tun0 and,
        with VXLAN, vxlan0."""
        await self.daemons.start()
        db = await self.connect()
        await db.ensure_bridge(t.BRIDGE, self.daemons.datapath)
        await db.add_port(t.BRIDGE, t.TUN, type="internal", ofport=t.TUN_PORT)
        await db.set_interface(t.TUN, mtu_request=node.mtu)
        underlay = UnderlaySetup(db, self.switch, self.kernel)
        if node.tunnel == "vxlan":
            await underlay.ensure(await self._underlay(underlay, node))
        else:
            await db.delete_port(t.BRIDGE, t.VXLAN)
            if await db.port(UNDERLAY_BRIDGE) is not None:
                await underlay.remove()

    async def peers(self, node: NodeNetwork, remotes: list[RemoteNode]) -> None:
        """VXLAN on the userspace datapath: br-phy's peer flows (each peer's MAC checked
        where it is known, ``UnderlaySetup.ensure_peers``), then have OVS resolve the
        remote nodes' MACs now, so the first packet to a new node is not lost
        (``UnderlaySetup.prime``)."""
        if node.tunnel != "vxlan":
            return
        setup = UnderlaySetup(await self.connect(), self.switch, self.kernel)
        underlay = await self._underlay(setup, node)
        await setup.ensure_peers(underlay, vtep_peers(node, remotes, [underlay.address.network]))
        if remotes:
            await setup.prime(underlay, [r.node_ip for r in usable_remotes(node, remotes)])

    async def _underlay(self, setup: UnderlaySetup, node: NodeNetwork) -> Underlay:
        return await setup.discover(node, self.daemons.datapath)

    async def add_pod(self, host: str, ofport: int, ids: Mapping[str, str]) -> int:
        """Pod port ``host`` with ``ofport`` and its identity; returns the ofport."""
        db = await self.connect()
        return await db.add_port(t.BRIDGE, host, ofport=ofport, external_ids=ids)

    async def delete(self, host: str) -> None:
        db = await self.connect()
        await db.delete_port(t.BRIDGE, host)

    async def ofport(self, name: str) -> int:
        port = await (await self.connect()).port(name)
        return -1 if port is None else port.ofport

    async def attached(self) -> list[PodAttachment]:
        """The pods whose ports carry a whole identity, by host port name."""
        if not self.running():
            return []
        db = await self.connect()
        found = (ovspods.attachment_of(p.name, p.external_ids) for p in await db.ports(t.BRIDGE))
        return sorted((a for a in found if a is not None), key=lambda a: a.host_ifname)

    async def pod_port_names(self) -> list[str]:
        """The names of podnet's pod ports on br0."""
        db = await self.connect()
        return [p.name for p in await db.ports(t.BRIDGE) if is_host_veth_name(p.name)]

    async def remove_orphans(self, dead: Collection[str] = ()) -> set[str]:
        """Delete podnet-named ports without an identity or a device (a crash in the
        middle of an attach), and those named in ``dead`` (their veth is gone); returns
        the names of the ports left."""
        db = await self.connect()
        ports = await db.ports(t.BRIDGE)
        orphans = {
            p.name
            for p in ports
            if is_host_veth_name(p.name)
            and (
                p.ofport <= 0
                or p.name in dead
                or ovspods.attachment_of(p.name, p.external_ids) is None
            )
        }
        for name in sorted(orphans):
            await db.delete_port(t.BRIDGE, name)
        return {p.name for p in ports} - orphans


def _port_problems(port: Port | None, name: str, kind: str, ofport: int) -> list[str]:
    if port is None:
        return [f"{name} is missing"]
    found = []
    if port.type != kind:
        found.append(f"{name} is of type {port.type or 'system'}, want {kind}")
    if port.ofport != ofport:
        found.append(f"{name} has ofport {port.ofport}, want {ofport}")
    return found


async def flow_problems(daemons: OvsDaemons, flows: list[Flow]) -> list[str]:
    """How br0's flows differ from ``flows``, by OVS's own comparison (none: equal)."""
    argv = [binary("ovs-ofctl"), "-O", "OpenFlow13", "--no-names", "diff-flows", t.BRIDGE]
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            "/dev/stdin",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=daemons.paths.env(),
        )
        async with asyncio.timeout(DIFF_TIMEOUT):
            out, err = await process.communicate(flows_text(flows).encode())
    except (OSError, TimeoutError) as error:
        raise DataPlaneError(f"ovs-ofctl diff-flows failed to run: {error}") from error
    if process.returncode not in (0, 2):
        return [f"{t.BRIDGE}'s flows cannot be read: {err.decode().strip()}"]
    stale = [line[1:] for line in out.decode().splitlines() if line.startswith("-")]
    missing = [line[1:] for line in out.decode().splitlines() if line.startswith("+")]
    found = []
    if missing:
        found.append(f"{len(missing)} flow(s) missing on {t.BRIDGE}, e.g. {missing[:SHOWN]}")
    if stale:
        found.append(f"{len(stale)} stale flow(s) on {t.BRIDGE}, e.g. {stale[:SHOWN]}")
    return found
