"""What the API tells the writer of an egress object about what the data plane does with
it (never a silent yes).

- An EgressNetworkPolicy is stored with the status condition ``Enforced``: True when the
  agents enforce it (CIDR rules, a project with a VNID, the networkpolicy or multitenant
  plugin), else False with the reason (the subnet plugin, a global project, dnsName
  rules, which match no address yet). A second policy in a project is refused (422), as
  OpenShift SDN allows one per project.
- ``egressIPs``/``egressCIDRs`` on a NetNamespace or a HostSubnet are stored but not
  implemented yet.

Anything not enforced is answered with a ``Warning`` header (kubectl prints it) and a
Warning Event naming the object. The functions are pure; ``Notices`` is the server's thin
side (the header, and the Event recorded after the write).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from podnet.api.registry import Registry
from podnet.model import errors
from podnet.model.kinds import EVENT, HOST_SUBNET, NET_NAMESPACE, Kind
from podnet.store.base import StoreUnavailable

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ENFORCED = "Enforced"
EVENT_REASON = "EgressNotEnforced"
COMPONENT = "podnet-master"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


EGRESS_FIELDS = {NET_NAMESPACE.kind: ("egressIPs",), HOST_SUBNET.kind: ("egressIPs", "egressCIDRs")}


@dataclass(frozen=True)
class FirewallFacts:
    """What the API knows when an EgressNetworkPolicy is written."""

    uses_vnids: bool  # the cluster's plugin is networkpolicy or multitenant
    netid: int | None  # the project's VNID (None: no NetNamespace yet)


@dataclass(frozen=True)
class Verdict:
    """The policy's ``Enforced`` condition."""

    enforced: bool
    reason: str
    message: str


def firewall_verdict(policy: Mapping[str, Any], facts: FirewallFacts) -> Verdict:
    """Whether the data plane enforces ``policy``, and why not (as of this write: a
    project made global later is not re-judged here, the agents' logs say so)."""
    if not facts.uses_vnids:
        return Verdict(
            False,
            "SubnetPlugin",
            "the subnet plugin filters no egress: the firewall needs the networkpolicy or "
            "multitenant plugin; traffic from this project is NOT filtered",
        )
    if facts.netid == 0:
        return Verdict(
            False,
            "GlobalProject",
            "the project is global (VNID 0), which OpenShift SDN never firewalls: traffic "
            "from this project is NOT filtered",
        )
    spec = policy.get("spec") or {}
    rules = spec.get("egress") or [] if isinstance(spec, Mapping) else []
    if any(isinstance(r, Mapping) and "dnsName" in (r.get("to") or {}) for r in rules):
        return Verdict(
            False,
            "DNSNamesNotSupported",
            "cidrSelector rules are enforced, but dnsName rules match no address yet: a "
            "Deny by name filters nothing and an Allow by name allows nothing",
        )
    return Verdict(
        True,
        "Enforced",
        "enforced for the project's pods on every node: first match wins, no match allows",
    )


def egress_ip_notice(kind: Kind | None, new: Mapping[str, Any] | None) -> str | None:
    """What a write of egress IPs must be told it does not get, or None."""
    if new is None or kind is None or kind.group != NET_NAMESPACE.group:
        return None
    given = [f for f in EGRESS_FIELDS.get(kind.kind, ()) if new.get(f)]
    if not given:
        return None
    return (
        f"podnet does not implement egress IPs yet: {kind.kind} {', '.join(given)} "
        "are stored and have no effect; traffic leaves with its node's address"
    )


def stamp(policy: Obj, verdict: Verdict) -> None:
    """The policy's status says what the data plane does with it (whatever the body said)."""
    policy["status"] = {
        "conditions": [
            {
                "type": ENFORCED,
                "status": "True" if verdict.enforced else "False",
                "reason": verdict.reason,
                "message": verdict.message,
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
