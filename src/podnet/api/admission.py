"""Admission that reads the registry: a node's pod addresses, owners, and event quotas.

It runs after the authorizer (``podnet.api.authorizer``: rules and the pure
NodeRestriction checks) inside the registry's write, just before the transaction:

- a node's pod write (create, or status update) may only set addresses it owns: every
  new ``status.podIP``/``podIPs`` lies inside the node's HostSubnet (403 otherwise) and
  is no other pod's address (409 AlreadyExists: the agent retries until the old holder
  is cleared); ``status.hostIP`` is the HostSubnet's ``hostIP``;
- a node's mirror pod that names an owner names its own Node by its current UID;
- the controllers' writes and deletes: ControllerRestriction
  (``podnet.api.controllerrestriction``);
- events: size for everyone, then reporter and quota (``podnet.api.events``);
- a CertificateSigningRequest's requester (``podnet.api.csrrestriction``);
- an EgressNetworkPolicy: one per project (422), its ``Enforced`` condition, and the
  warning for what is not enforced (``podnet.api.egressnotice``).
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Mapping, MutableMapping
from typing import Any

from podnet.api import egressnotice
from podnet.api.addressholders import address_holders
from podnet.api.authorizer import WRITE_VERBS, RequestAttributes
from podnet.api.controllerrestriction import ControllerRestriction
from podnet.api.csrrestriction import admit_create, is_csr, own_fields, require_room
from podnet.api.events import EventLimits, EventQuota, EventSweeper, admit_event
from podnet.api.identity import User
from podnet.api.podaddresses import pod_ips
from podnet.api.registry import Obj, Registry
from podnet.api.watchcache import WatchCache
from podnet.model import errors
from podnet.model.kinds import (
    CERTIFICATE_SIGNING_REQUEST,
    CLUSTER_NETWORK,
    EGRESS_NETWORK_POLICY,
    EVENT,
    HOST_SUBNET,
    NET_NAMESPACE,
    NODE,
    POD,
    Kind,
)
from podnet.model.network import SUBNET, plugin_name, uses_vnids


def _same(kind: Kind | None, other: Kind) -> bool:
    return kind is not None and (kind.group, kind.plural) == (other.group, other.plural)


def _short(plugin: str) -> str:
    try:
        return plugin_name(plugin) if plugin else SUBNET
    except ValueError:
        return SUBNET


def _host_ip(pod: Mapping[str, Any] | None) -> Any:
    status = (pod or {}).get("status")
    return status.get("hostIP") if isinstance(status, Mapping) else None


class Admission:
    """The registry-backed admission step, and the event quota it keeps."""

    def __init__(
        self,
        registry: Registry,
        limits: EventLimits | None = None,
        cache: WatchCache | None = None,
    ) -> None:
        self.registry = registry
        self.cache = cache  # answers "who holds this address" without reading every pod
        self.quota = EventQuota(limits or EventLimits.from_env())
        self.sweeper = EventSweeper(registry, self.quota)
        self.controllers = ControllerRestriction.over(registry, cache)

    async def admit(self, user: User, attrs: RequestAttributes) -> str | None:
        """Raise an ``ApiError`` when the write may not happen; may stamp the new object.
        Returns what the writer must be warned of (``podnet.api.egressnotice``), if any."""
        new = attrs.new_object
        warning = None
        if attrs.verb in WRITE_VERBS and isinstance(new, dict) and not attrs.subresource:
            if _same(attrs.kind, EGRESS_NETWORK_POLICY):
                verdict = egressnotice.firewall_verdict(new, await self._firewall_facts(new))
                egressnotice.stamp(new, verdict)
                warning = None if verdict.enforced else verdict.message
            else:
                warning = egressnotice.egress_ip_notice(attrs.kind, new)
        await self._admit(user, attrs)
        return warning

    async def _firewall_facts(self, policy: Obj) -> egressnotice.FirewallFacts:
        """The plugin and the project's VNID; 422 for a second policy in a project."""
        meta = policy.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        held, _ = await self.registry.list(EGRESS_NETWORK_POLICY, namespace)
        others = [p["metadata"]["name"] for p in held if p["metadata"]["name"] != name]
        if others:
            raise errors.invalid(
                EGRESS_NETWORK_POLICY.kind,
                name,
                [
                    errors.FieldError(
                        "metadata.name",
                        f"project {namespace} has EgressNetworkPolicy "
                        f"{others[0]!r} already: OpenShift SDN enforces one per project",
                    )
                ],
            )
        plugin = ""
        with contextlib.suppress(errors.ApiError):
            network = await self.registry.get(CLUSTER_NETWORK, None, "default")
            plugin = str(network.get("pluginName") or "")
        netid = None
        with contextlib.suppress(errors.ApiError):
            found = await self.registry.get(NET_NAMESPACE, None, namespace)
            netid = found.get("netid") if isinstance(found.get("netid"), int) else None
        return egressnotice.FirewallFacts(uses_vnids(_short(plugin)), netid)

    async def _admit(self, user: User, attrs: RequestAttributes) -> None:
        new = attrs.new_object
        if is_csr(attrs.kind) and attrs.verb == "create" and isinstance(new, dict):
            admit_create(user, new)  # the requester's identity, whatever the body said
            await self._csr_room(user)
        if _same(attrs.kind, EVENT) and attrs.verb in WRITE_VERBS:
            admit_event(self.quota, user, attrs.verb, new if isinstance(new, dict) else None)
        if user.is_controllers and not user.is_admin:
            await self.controllers.check(user, attrs)
        node = user.node_name
        if node is None or user.is_admin or new is None or attrs.verb not in WRITE_VERBS:
            return
        if _same(attrs.kind, POD):
            await self._pod_addresses(node, new, attrs.old_object)
            if attrs.verb == "create":
                await self._owner_is_this_node(node, new)

    async def _csr_room(self, user: User) -> None:
        """A requester's count of CSRs (from the watch cache when there is one)."""
        if user.is_admin:
            return
        fields = own_fields(user, CERTIFICATE_SIGNING_REQUEST)
        if self.cache is not None:
            held = len(self.cache.objects(CERTIFICATE_SIGNING_REQUEST, None, None, fields)[0])
        else:
            held = len(
                (await self.registry.list(CERTIFICATE_SIGNING_REQUEST, None, None, fields))[0]
            )
        require_room(user, held)

    async def _pod_addresses(self, node: str, new: Mapping[str, Any], old: Obj | Any) -> None:
        added = pod_ips(new) - pod_ips(old)
        host_ip = _host_ip(new)
        if not added and (host_ip is None or host_ip == _host_ip(old)):
            return
        subnet, node_ip = await self._node_subnet(node)
        for ip in sorted(added):
            if not _inside(ip, subnet):
                raise errors.forbidden(
                    f"node {node} may not give a pod the address {ip}: it is outside the "
                    f"node's HostSubnet {subnet}"
                )
        if host_ip is not None and host_ip != node_ip:
            raise errors.forbidden(
                f"node {node} may not set a pod's hostIP to {host_ip}: its own is {node_ip}"
            )
        await self._unused(added, new)

    async def _node_subnet(self, node: str) -> tuple[str, str]:
        try:
            hostsubnet = await self.registry.get(HOST_SUBNET, None, node)
        except errors.ApiError as exc:
            if exc.code != 404:
                raise
            hostsubnet = {}
        subnet = hostsubnet.get("subnet")
        if not subnet:
            raise errors.forbidden(f"node {node} has no HostSubnet yet: it may not set pod IPs")
        return str(subnet), str(hostsubnet.get("hostIP"))

    async def _unused(self, ips: set[str], pod: Mapping[str, Any]) -> None:
        if not ips:
            return
        meta = pod.get("metadata") or {}
        me = f"{meta.get('namespace')}/{meta.get('name')}"
        holders = await self._holders(ips)
        for ip in sorted(ips):
            others = sorted(holders.get(ip, set()) - {me})
            if others:
                # AlreadyExists, not Conflict: a Conflict is a stale write, retried at once.
                message = (
                    f'pods "{meta.get("name")}": podIP {ip} is already used by pod {others[0]}'
                )
                raise errors.ApiError(message, 409, "AlreadyExists", "pods", str(meta.get("name")))

    async def _holders(self, ips: set[str]) -> dict[str, set[str]]:
        """``ns/name`` of the pods claiming each of ``ips`` (``address_holders``)."""
        return await address_holders(self.registry, self.cache, ips)

    async def _owner_is_this_node(self, node: str, pod: Mapping[str, Any]) -> None:
        owners = (pod.get("metadata") or {}).get("ownerReferences") or []
        if not owners:
            return
        uid = owners[0].get("uid") if isinstance(owners[0], MutableMapping) else None
        try:
            current = (await self.registry.get(NODE, None, node))["metadata"].get("uid")
        except errors.ApiError as exc:
            if exc.code != 404:
                raise
            current = None
        if uid is None or uid != current:
            raise errors.forbidden(
                f"node {node} may only own pods by its current Node UID ({current}), not {uid}"
            )


def _inside(ip: str, subnet: str) -> bool:
    try:
        return ipaddress.ip_address(ip) in ipaddress.ip_network(subnet, strict=False)
    except ValueError:
        return False
