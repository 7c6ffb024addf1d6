"""The agent's watches of HostSubnets and ClusterNetwork ``default``.

HostSubnets feed ``RemoteNodeSync`` (the whole set, folded from the listing and its
changes) and tell when this node's own subnet moved; ClusterNetwork changes are compared
with what the node was set up for. Neither is applied while running: both need a data
plane rebuild, so they are logged as errors or warnings asking for an agent restart.
"""

from __future__ import annotations

import logging
from ipaddress import IPv4Address
from typing import Any

from podnet.agent.config import AgentConfig, network_changes, node_network
from podnet.agent.policies import PolicySync, WatchSource
from podnet.agent.remotes import RemoteNodeSync
from podnet.client import LISTED, WatchEvent
from podnet.dataplane.interface import NodeNetwork
from podnet.model.kinds import CLUSTER_NETWORK, HOST_SUBNET

log = logging.getLogger("podnet.agent")

Obj = dict[str, Any]
CLUSTER_NETWORK_NAME = "default"


def apply_event(objects: dict[str, Obj], event: WatchEvent) -> None:
    """Fold one watch event into ``objects`` (name -> object)."""
    if event.type == LISTED:
        objects.clear()
        objects.update({o["metadata"]["name"]: o for o in event.items})
    elif event.object is not None:
        name = event.object["metadata"]["name"]
        if event.type == "DELETED":
            objects.pop(name, None)
        else:
            objects[name] = event.object


class ClusterWatch:
    """Watches what the node was set up from; ``node`` is what it serves now."""

    def __init__(
        self,
        watches: WatchSource,
        config: AgentConfig,
        node_ip: IPv4Address,
        node: NodeNetwork,
    ) -> None:
        self.watches = watches  # the agent's shared watches (client.informers)
        self.config = config
        self.node_ip = node_ip
        self.node = node
        self._announced = node  # the network last announced (changes are said once)
        self._own_subnet: str | None = str(node.subnet)  # as last seen in an event

    async def watch_hostsubnets(self, remote_sync: RemoteNodeSync) -> None:
        """Hand every HostSubnet set to ``remote_sync``; for ever."""
        hostsubnets: dict[str, Obj] = {}
        async for event in self.watches.watch(HOST_SUBNET):
            apply_event(hostsubnets, event)
            self._check_own_subnet(hostsubnets.get(self.config.node_name))
            remote_sync.replace(hostsubnets)

    def _check_own_subnet(self, hostsubnet: Obj | None) -> None:
        subnet = (hostsubnet or {}).get("subnet")
        if subnet != self._own_subnet:
            self._own_subnet = subnet
            if subnet == str(self.node.subnet):
                return
            log.error(
                "this node's HostSubnet is now %s (serving %s); restart the agent to rebuild",
                subnet or "gone",
                self.node.subnet,
            )

    async def watch_cluster_network(self, policy_sync: PolicySync) -> None:
        """Warn when ClusterNetwork ``default`` changes; for ever."""
        networks: dict[str, Obj] = {}
        async for event in self.watches.watch(CLUSTER_NETWORK):
            apply_event(networks, event)
            self._check_cluster_network(networks.get(CLUSTER_NETWORK_NAME), policy_sync)

    def _check_cluster_network(self, network: Obj | None, policy_sync: PolicySync) -> None:
        if network is None:
            log.warning(
                "ClusterNetwork %s is gone; keeping the current set-up", CLUSTER_NETWORK_NAME
            )
            return
        new = node_network(self.config, self.node_ip, {"subnet": str(self.node.subnet)}, network)
        changes = network_changes(self._announced, new) + policy_sync.plugin_change(network)
        if changes:
            log.warning(
                "ClusterNetwork changed (%s); this needs a data plane rebuild: restart "
                "the node agent to apply it",
                "; ".join(changes),
            )
            self._announced = new
