"""Egress features podnet stores but does not enforce yet, said out loud (never a silent
yes): EgressNetworkPolicy, ``NetNamespace.egressIPs`` and ``HostSubnet.egressIPs`` /
``egressCIDRs``.

OpenShift SDN manifests still apply (they are valid objects), but every write of one of
them is answered with a ``Warning`` header (kubectl prints it), an EgressNetworkPolicy is
stored with the status condition ``Enforced=False`` (reason ``NotImplemented``), and an
Event of type Warning names the object. These are pure functions; the API server calls
them in admission and records the Events after the write.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from podnet.api.registry import Registry
from podnet.model import errors
from podnet.model.kinds import EGRESS_NETWORK_POLICY, EVENT, HOST_SUBNET, NET_NAMESPACE, Kind
from podnet.store.base import StoreUnavailable

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ENFORCED = "Enforced"
REASON = "NotImplemented"
EVENT_REASON = "EgressNotEnforced"
COMPONENT = "podnet-master"
FIREWALL = (
    "podnet does not enforce EgressNetworkPolicy yet: traffic from this project's pods "
    "to destinations outside the cluster is NOT filtered"
)
EGRESS_FIELDS = {NET_NAMESPACE.kind: ("egressIPs",), HOST_SUBNET.kind: ("egressIPs", "egressCIDRs")}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _same(kind: Kind | None, other: Kind) -> bool:
    return kind is not None and kind.group == other.group and kind.kind == other.kind


def notice(kind: Kind | None, new: Mapping[str, Any] | None) -> str | None:
    """What a write of ``new`` must be told it does not get, or None."""
    if new is None or kind is None:
        return None
    if _same(kind, EGRESS_NETWORK_POLICY):
        return FIREWALL
    fields = EGRESS_FIELDS.get(kind.kind) if kind.group == NET_NAMESPACE.group else None
    given = [f for f in fields or () if new.get(f)]
    if not given:
        return None
    return (
        f"podnet does not implement egress IPs yet: {kind.kind} {', '.join(given)} "
        "are stored and have no effect; traffic leaves with its node's address"
    )


def stamp(kind: Kind | None, new: Obj) -> None:
    """An EgressNetworkPolicy's status says it is not enforced (whatever the body said)."""
    if not _same(kind, EGRESS_NETWORK_POLICY):
        return
    new["status"] = {
        "conditions": [
            {
                "type": ENFORCED,
                "status": "False",
                "reason": REASON,
                "message": FIREWALL,
                "lastTransitionTime": _now(),
            }
        ]
    }


def warning_header(message: str) -> str:
    """An RFC 7234 ``Warning`` value as kube-apiserver sends it (code 299)."""
    text = message.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{text}"'


def event(kind: Kind, obj: Mapping[str, Any], message: str) -> tuple[Obj, str]:
    """(a Warning Event about ``obj``, the namespace it goes in)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    namespace = str(meta.get("namespace") or "default")
    now = _now()
    api_version = f"{kind.group}/{kind.version}" if kind.group else kind.version
    involved = {"apiVersion": api_version, "kind": kind.kind, "name": name}
    if meta.get("namespace"):
        involved["namespace"] = namespace
    if meta.get("uid"):
        involved["uid"] = str(meta["uid"])
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": involved,
        "reason": EVENT_REASON,
        "message": message,
        "type": "Warning",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    return body, namespace


class Notices:
    """The server's side: the ``Warning`` header on the response, and the Event recorded
    in the background once the write succeeded."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._tasks: set[asyncio.Task[None]] = set()

    def tell(self, response: web.StreamResponse, kind: Kind, obj: Obj, message: str) -> None:
        response.headers.add("Warning", warning_header(message))
        body, namespace = event(kind, obj, message)
        task = asyncio.create_task(self._record(body, namespace))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, body: Obj, namespace: str) -> None:
        try:
            await self.registry.create(EVENT, body, namespace)
        except (errors.ApiError, StoreUnavailable) as exc:
            log.warning("event %s not recorded: %s", body["reason"], exc)
