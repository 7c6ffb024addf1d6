"""The HostSubnet controller: one subnet of the cluster network per node.

Start order, as in OpenShift SDN: list the HostSubnets and mark every subnet allocated,
then list the Nodes, and only then reconcile. Each name (a Node and its HostSubnet share
it) is one work item, so a name is handled by one worker at a time, and every handler is
safe to run again: it compares the cached Node and HostSubnet and writes only what is
missing. The API's subnet claim (a HostSubnet's subnet is unique) makes a duplicate
subnet impossible even when two masters race; losing that race (409 AlreadyExists) just
means "try the next subnet".
"""

from __future__ import annotations

import copy
from functools import partial
from ipaddress import IPv4Network
from typing import Any

from podnet.client.errors import has_reason
from podnet.client.watch import ADDED, DELETED, MODIFIED
from podnet.controllers.base import SYNC, Controller, Watch, track
from podnet.controllers.cache import ObjectCache, revision_of
from podnet.controllers.calls import (
    ControllerApi,
    call,
    delete_if_present,
    get_or_none,
    guaranteed_update,
)
from podnet.controllers.config import NetworkConfig
from podnet.controllers.objects import (
    CONDITION,
    NODE_UID_ANNOTATION,
    REASON_ALLOCATED,
    REASON_EXHAUSTED,
    annotations_of,
    has_condition,
    host_matches,
    hostsubnet_object,
    is_assigned_host,
    node_internal_ip,
    node_underlay_mac,
    record_node_event,
    set_network_condition,
    subnet_of,
    with_host,
)
from podnet.controllers.subnets import SubnetAllocator, SubnetsExhausted
from podnet.model.kinds import CLUSTER_NETWORK, HOST_SUBNET, NODE

Obj = dict[str, Any]
WORKERS = 16


class HostSubnetController(Controller):
    """Keeps one HostSubnet per Node, and fills in subnets for ``assign-subnet`` hosts."""

    name = "hostsubnets"

    def __init__(
        self, api: ControllerApi, cluster_network_obj: Obj, resync_period: float | None = 300.0
    ) -> None:
        super().__init__(api, WORKERS, resync_period)
        config = NetworkConfig.from_object(cluster_network_obj)
        self.allocator = SubnetAllocator(config.cluster_networks)
        self.nodes = ObjectCache()
        self.subnets = ObjectCache()
        self._owners: dict[IPv4Network, str] = {}  # subnet -> HostSubnet name
        self._waiting: set[str] = set()  # names that found no free subnet
        self._evented: set[str] = set()  # waiting nodes already given an Event
        self._no_ip: set[str] = set()  # nodes already logged as lacking an InternalIP

    @property
    def waiting(self) -> set[str]:
        """Names waiting for a subnet to be released."""
        return set(self._waiting)

    def watches(self) -> list[Watch]:
        """Mark existing subnets first, then list Nodes; the ClusterNetwork for growth."""
        return [
            Watch(HOST_SUBNET, self._on_hostsubnet),
            Watch(NODE, self._on_node),
            Watch(CLUSTER_NETWORK, self._on_cluster_network),
        ]

    def summary(self) -> str:
        nodes, hostsubnets, free = len(self.nodes), len(self.subnets), self.allocator.available
        return f"{nodes} nodes, {hostsubnets} HostSubnets, {free} of {self.allocator.total} free"

    # ---- events -------------------------------------------------------------------------

    def _on_hostsubnet(self, change: str, obj: Obj) -> None:
        name = track(self.subnets, change, obj, self._remember, self._forget)
        if name is not None:
            self.queue.add(name)

    def _on_node(self, change: str, obj: Obj) -> None:
        name = track(self.nodes, change, obj)
        if name is None:
            return
        if change == DELETED:
            for remembered in (self._waiting, self._evented, self._no_ip):
                remembered.discard(name)
        self.queue.add(name)

    def _remember(self, hostsubnet: Obj) -> None:
        """Cache a HostSubnet version and keep the allocator's marks in step with it."""
        stored, old = self.subnets.put(hostsubnet)
        if not stored:
            return
        before = subnet_of(old) if old else None
        after = subnet_of(hostsubnet)
        if before != after and before is not None:
            self._release(before)
        if after is not None:
            self.allocator.mark_allocated(after)
            self._owners[after] = hostsubnet["metadata"]["name"]

    def _forget(self, name: str, revision: int) -> None:
        old = self.subnets.remove(name, revision)
        subnet = subnet_of(old) if old else None
        if subnet is not None:
            self._release(subnet)

    def _release(self, subnet: IPv4Network) -> None:
        self._owners.pop(subnet, None)
        self.allocator.release(subnet)
        for name in self._waiting:
            self.queue.add(name)

    def _on_cluster_network(self, change: str, obj: Obj) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if change in (SYNC, ADDED, MODIFIED) and name == "default":
            self.apply_cluster_network(obj)

    def apply_cluster_network(self, obj: Obj) -> None:
        """Follow a permitted grow of the ClusterNetwork; log and ignore anything else."""
        try:
            entries = NetworkConfig.from_object(obj).cluster_networks
            if entries == self.allocator.entries:
                return
            self.allocator.grow(entries)
        except (KeyError, ValueError) as exc:
            self.log.error("ignoring ClusterNetwork change: %s", exc)
            return
        nets = ",".join(str(e) for e in entries)
        self.log.info(
            "cluster network is now %s: %d subnets, %d free",
            nets,
            self.allocator.total,
            self.allocator.available,
        )
        for name in self._waiting:
            self.queue.add(name)

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, name: str) -> None:
        node = self.nodes.get(name)
        hostsubnet = self.subnets.get(name)
        if hostsubnet is not None and is_assigned_host(hostsubnet):
            await self._fill_assigned(hostsubnet)
        elif node is not None:
            await self._ensure_for_node(node, hostsubnet)
        elif hostsubnet is not None:
            await self._remove_orphan(hostsubnet)

    async def _ensure_for_node(self, node: Obj, hostsubnet: Obj | None) -> None:
        name = node["metadata"]["name"]
        ip = node_internal_ip(node)
        if ip is None:
            if name not in self._no_ip:
                self._no_ip.add(name)
                self.log.info("node %s has no InternalIP address; no subnet yet", name)
            return
        self._no_ip.discard(name)
        owner = annotations_of(hostsubnet).get(NODE_UID_ANNOTATION) if hostsubnet else None
        if hostsubnet is not None and owner and owner != node["metadata"].get("uid"):
            if not await self._remove_orphan(hostsubnet):
                return
            hostsubnet = None
        if hostsubnet is None:
            await self._allocate_for(node, ip)
        else:
            await self._update_host(hostsubnet, node, ip)

    async def _remove_orphan(self, hostsubnet: Obj) -> bool:
        """Delete a HostSubnet whose Node is gone or is a different one; True once deleted."""
        name = hostsubnet["metadata"]["name"]
        # The cache may lag behind: confirm with a fresh read before deleting.
        node = await get_or_none(self.api, NODE, None, name)
        owner = annotations_of(hostsubnet).get(NODE_UID_ANNOTATION)
        if node is not None:
            self.nodes.put(node)
            if owner in (None, "", node["metadata"].get("uid")):
                self.queue.add(name)  # not an orphan after all; look again
                return False
        why = "its node is gone" if node is None else "its node was replaced"
        self.log.info("deleting HostSubnet %s (%s): %s", name, hostsubnet.get("subnet"), why)
        version = revision_of(hostsubnet)
        if await delete_if_present(self.api, HOST_SUBNET, None, name, version):
            self._forget(name, version)  # the version the delete was pinned to
        return True

    async def _allocate_for(self, node: Obj, ip: str) -> None:
        name, uid = node["metadata"]["name"], str(node["metadata"].get("uid") or "")
        while True:
            try:
                subnet = self.allocator.allocate()
            except SubnetsExhausted:
                await self._exhausted(node)
                return
            body = hostsubnet_object(name, ip, subnet, uid, node_underlay_mac(node))
            try:
                created = await call(
                    partial(self.api.create, HOST_SUBNET, body), f"create HostSubnet {name}"
                )
            except Exception as exc:
                if not has_reason(exc, "AlreadyExists"):
                    self.allocator.release(subnet)
                    raise
                if await self._lost_race(name, subnet):
                    return
                continue
            self._remember(created)
            self.log.info("allocated subnet %s for node %s (%s)", subnet, name, ip)
            await self._subnet_assigned(node, subnet)
            return

    async def _lost_race(self, name: str, subnet: IPv4Network) -> bool:
        """After a 409: True if ``name`` has a HostSubnet now; False if ``subnet`` was taken."""
        existing = await get_or_none(self.api, HOST_SUBNET, None, name)
        if existing is None:
            # Another master's HostSubnet holds the subnet; it stays marked, try the next.
            self.log.info("subnet %s is already claimed; trying the next one for %s", subnet, name)
            return False
        self._remember(existing)
        if subnet not in self._owners:
            self.allocator.release(subnet)
        self.queue.add(name)  # compare the existing HostSubnet with the node again
        return True

    async def _update_host(self, hostsubnet: Obj, node: Obj, ip: str) -> None:
        """Keep the subnet; bring hostIP, the node-uid and underlay MAC annotations up to
        date."""
        name, uid = node["metadata"]["name"], str(node["metadata"].get("uid") or "")
        subnet = subnet_of(hostsubnet)
        mac = node_underlay_mac(node)
        if not host_matches(hostsubnet, ip, uid, mac):
            updated = await guaranteed_update(
                self.api, HOST_SUBNET, None, name, lambda hs: with_host(hs, ip, uid, mac)
            )
            if updated is not None:
                if hostsubnet.get("hostIP") != ip:
                    self.log.info(
                        "node %s IP changed %s -> %s; HostSubnet keeps subnet %s",
                        name,
                        hostsubnet.get("hostIP"),
                        ip,
                        subnet,
                    )
                self._remember(updated)
        if subnet is not None:
            await self._subnet_assigned(node, subnet)

    async def _fill_assigned(self, hostsubnet: Obj) -> None:
        """Give a subnet to a user's ``assign-subnet`` HostSubnet that has none yet."""
        if subnet_of(hostsubnet) is not None:
            return
        name = hostsubnet["metadata"]["name"]
        while True:
            try:
                subnet = self.allocator.allocate()
            except SubnetsExhausted:
                if name not in self._waiting:
                    self._waiting.add(name)
                    self.log.error("no subnets available for HostSubnet %s", name)
                return
            if await self._write_assigned(hostsubnet, subnet):
                return

    async def _write_assigned(self, hostsubnet: Obj, subnet: IPv4Network) -> bool:
        """Store ``subnet`` in the HostSubnet; False if only the subnet's claim failed."""
        name = hostsubnet["metadata"]["name"]
        body = copy.deepcopy(hostsubnet)
        body["subnet"] = str(subnet)
        try:
            updated = await call(
                lambda: self.api.update(HOST_SUBNET, body), f"assign a subnet to HostSubnet {name}"
            )
        except Exception as exc:
            self.allocator.release(subnet)
            if not has_reason(exc, "Conflict"):
                raise
            current = await get_or_none(self.api, HOST_SUBNET, None, name)
            if current is None or revision_of(current) != revision_of(hostsubnet):
                if current is not None:
                    self._remember(current)
                self.queue.add(name)
                return True
            self.allocator.mark_allocated(subnet)  # unchanged object: the claim lost a race
            return False
        self._remember(updated)
        self._waiting.discard(name)
        host_ip = body.get("hostIP")
        self.log.info("assigned subnet %s to HostSubnet %s (host %s)", subnet, name, host_ip)
        return True

    # ---- exhaustion and conditions ----------------------------------------------------

    async def _exhausted(self, node: Obj) -> None:
        name = node["metadata"]["name"]
        nets = ",".join(str(e) for e in self.allocator.entries)
        message = (
            f"no subnets available for node {name}: "
            f"all {self.allocator.total} subnets of {nets} are in use"
        )
        if name not in self._waiting:
            self._waiting.add(name)
            self.log.error("no subnets available for node %s (%s)", name, nets)
        await self._set_condition(node, "True", REASON_EXHAUSTED, message)
        if name not in self._evented:
            await record_node_event(self.api, node, REASON_EXHAUSTED, message, self.log)
            self._evented.add(name)

    async def _subnet_assigned(self, node: Obj, subnet: IPv4Network) -> None:
        name = node["metadata"]["name"]
        self._waiting.discard(name)
        self._evented.discard(name)
        if has_condition(node, "True", REASON_EXHAUSTED):
            message = f"subnet {subnet} allocated"
            await self._set_condition(node, "False", REASON_ALLOCATED, message)

    async def _set_condition(self, node: Obj, status: str, reason: str, message: str) -> None:
        if has_condition(node, status, reason):
            return
        updated = await set_network_condition(self.api, node, status, reason, message)
        if updated is not None:
            self.nodes.put(updated)
            name = node["metadata"]["name"]
            self.log.info("node %s: condition %s=%s (%s)", name, CONDITION, status, reason)
