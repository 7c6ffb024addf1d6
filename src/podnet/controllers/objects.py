"""The objects the HostSubnet controller reads and writes, and their annotations.

HostSubnets carry ``pod.network.openshift.io/node-uid`` (the Node they belong to) or, for
a host that is not a node, ``pod.network.openshift.io/assign-subnet: "true"``; and
``podnet.io/underlay-mac``, copied from the Node's own annotation when it holds a usable
MAC (removed when it no longer does), which the other nodes check their VXLAN against. A node that
finds no free subnet gets ``NetworkUnavailable=True`` (reason ``NoSubnetsAvailable``) and a
Warning Event in namespace ``default``; once it gets a subnet the condition turns
``False`` (reason ``SubnetAllocated``).
"""

from __future__ import annotations

import logging
import uuid
from ipaddress import IPv4Network
from typing import Any

from podnet.api.objects import now_rfc3339
from podnet.client.errors import ClientError, has_reason
from podnet.controllers.calls import ControllerApi, call, guaranteed_update
from podnet.model.kinds import EVENT, HOST_SUBNET, NODE
from podnet.model.underlaymac import UNDERLAY_MAC_ANNOTATION, annotated_mac

Obj = dict[str, Any]

NODE_UID_ANNOTATION = "pod.network.openshift.io/node-uid"
ASSIGN_SUBNET_ANNOTATION = "pod.network.openshift.io/assign-subnet"
CONDITION = "NetworkUnavailable"
REASON_EXHAUSTED = "NoSubnetsAvailable"
REASON_ALLOCATED = "SubnetAllocated"
EVENT_NAMESPACE = "default"
COMPONENT = "podnet-master"


# ---- HostSubnets --------------------------------------------------------------------------


def annotations_of(obj: Obj) -> dict[str, str]:
    """A copy of the object's annotations (empty when it has none)."""
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def is_assigned_host(hostsubnet: Obj) -> bool:
    """Whether a user asked for this HostSubnet's subnet (a host that is not a node)."""
    return annotations_of(hostsubnet).get(ASSIGN_SUBNET_ANNOTATION) == "true"


def subnet_of(hostsubnet: Obj) -> IPv4Network | None:
    """The HostSubnet's subnet, or None when it has none (or an unreadable one)."""
    try:
        return IPv4Network(hostsubnet["subnet"]) if hostsubnet.get("subnet") else None
    except ValueError:
        return None


def hostsubnet_object(
    node: str, host_ip: str, subnet: IPv4Network, node_uid: str, mac: str | None = None
) -> Obj:
    """The HostSubnet of ``node`` (``mac``: its published underlay MAC, if any)."""
    notes = {NODE_UID_ANNOTATION: node_uid, **({UNDERLAY_MAC_ANNOTATION: mac} if mac else {})}
    return {
        "apiVersion": HOST_SUBNET.api_version,
        "kind": HOST_SUBNET.kind,
        "metadata": {"name": node, "annotations": notes},
        "host": node,
        "hostIP": host_ip,
        "subnet": str(subnet),
    }


def with_host(hostsubnet: Obj, ip: str, uid: str, mac: str | None = None) -> Obj | None:
    """``hostsubnet`` with hostIP, node-uid and the underlay MAC (removed when ``mac`` is
    None) set (None when already so)."""
    meta = hostsubnet.setdefault("metadata", {})
    notes = meta.setdefault("annotations", {})
    if host_matches(hostsubnet, ip, uid, mac):
        return None
    if notes.get(NODE_UID_ANNOTATION) not in (None, "", uid):
        return None  # it now belongs to another node object: the next reconcile decides
    hostsubnet["hostIP"] = ip
    notes[NODE_UID_ANNOTATION] = uid
    if mac:
        notes[UNDERLAY_MAC_ANNOTATION] = mac
    else:
        notes.pop(UNDERLAY_MAC_ANNOTATION, None)
    return hostsubnet


def host_matches(hostsubnet: Obj, ip: str, uid: str, mac: str | None) -> bool:
    """Whether the HostSubnet already has this hostIP, node-uid and underlay MAC."""
    notes = annotations_of(hostsubnet)
    return (
        hostsubnet.get("hostIP") == ip
        and notes.get(NODE_UID_ANNOTATION) == uid
        and notes.get(UNDERLAY_MAC_ANNOTATION) == mac
    )


# ---- Nodes --------------------------------------------------------------------------------


def node_underlay_mac(node: Obj) -> str | None:
    """The usable underlay MAC the node published about itself, or None."""
    return annotated_mac(node)


def node_internal_ip(node: Obj) -> str | None:
    """The node's ``InternalIP`` address, or None."""
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP" and address.get("address"):
            return str(address["address"])
    return None


def network_condition(node: Obj) -> Obj | None:
    """The node's ``NetworkUnavailable`` condition, if any."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == CONDITION), None)


def has_condition(node: Obj, status: str, reason: str) -> bool:
    """Whether the node's ``NetworkUnavailable`` condition has this status and reason."""
    current = network_condition(node)
    return current is not None and (current.get("status"), current.get("reason")) == (
        status,
        reason,
    )


def with_condition(node: Obj, status: str, reason: str, message: str) -> Obj | None:
    """``node`` with its ``NetworkUnavailable`` condition set (None when already so)."""
    if has_condition(node, status, reason):
        return None
    current = network_condition(node)
    now = now_rfc3339()
    since = now
    if current is not None and current.get("status") == status:
        since = current.get("lastTransitionTime", now)
    condition = {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": since,
    }
    status_obj = node.setdefault("status", {})
    others = [c for c in status_obj.get("conditions") or [] if c.get("type") != CONDITION]
    status_obj["conditions"] = [*others, condition]
    return node


async def set_network_condition(
    api: ControllerApi, node: Obj, status: str, reason: str, message: str
) -> Obj | None:
    """Write the condition to the Node's status; the updated Node, or None if unchanged/gone."""
    name = node["metadata"]["name"]
    try:
        return await guaranteed_update(
            api, NODE, None, name, lambda n: with_condition(n, status, reason, message), True
        )
    except Exception as exc:
        if has_reason(exc, "NotFound"):
            return None
        raise


def node_event(node: Obj, reason: str, message: str, kind: str = "Warning") -> Obj:
    """A v1 Event about ``node`` in namespace ``default``."""
    name = node["metadata"]["name"]
    now = now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": EVENT_NAMESPACE},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": node["metadata"].get("uid", ""),
        },
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def record_node_event(
    api: ControllerApi, node: Obj, reason: str, message: str, log: logging.Logger
) -> bool:
    """Create a Warning Event about ``node``; best effort (False and a log line on failure)."""
    name = node["metadata"]["name"]
    try:
        await call(
            lambda: api.create(EVENT, node_event(node, reason, message), EVENT_NAMESPACE),
            f"record event for node {name}",
        )
    except ClientError as exc:
        log.warning("could not record event %s for node %s: %s", reason, name, exc)
        return False
    return True
