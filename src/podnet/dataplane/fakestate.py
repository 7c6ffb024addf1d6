"""The fake data plane's "kernel": what ``FakeDataPlane`` holds, and its state file form.

The file keeps the version note, the remotes, the pods (each with its routes) as plain
JSON values, the call history and the policy rule set's fingerprint (not the rule set);
``load_state`` reads files written before pods had routes too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import TYPE_CHECKING, Any

from podnet.dataplane.interface import PodAttachment, RemoteNode

if TYPE_CHECKING:
    from podnet.policy.model import RuleSet
    from podnet.services.model import ServiceTable


@dataclass
class FakeState:
    """What the fake "kernel" holds: the node's version note, remotes, pods (with the
    routes each pod got besides its default route) and policy rules (the state file keeps
    the rule set's fingerprint, not the rule set)."""

    version_note: str = ""
    remotes: dict[str, RemoteNode] = field(default_factory=dict)
    pods: dict[tuple[str, str], PodAttachment] = field(default_factory=dict)
    pod_routes: dict[tuple[str, str], tuple[IPv4Network, ...]] = field(default_factory=dict)
    policy: RuleSet | None = None
    policy_fingerprint: str = ""
    services: ServiceTable | None = None  # in memory only


def load_state(data: dict[str, Any]) -> FakeState:
    """The state a file holds (the rule set itself is not in it)."""
    pods = data.get("pods", [])
    return FakeState(
        version_note=data.get("version_note", ""),
        remotes={r["name"]: _remote(r) for r in data.get("remotes", [])},
        pods={(p["container_id"], p["ifname"]): _attachment(p) for p in pods},
        pod_routes={
            (p["container_id"], p["ifname"]): tuple(map(IPv4Network, p.get("routes", [])))
            for p in pods
        },
        policy_fingerprint=data.get("policy_fingerprint", ""),
    )


def pod_record(attachment: PodAttachment, routes: tuple[IPv4Network, ...]) -> dict[str, Any]:
    """A pod as the file holds it."""
    record = {k: v if isinstance(v, int | str) else str(v) for k, v in asdict(attachment).items()}
    return {**record, "routes": [str(r) for r in routes]}


def dump_state(state: FakeState, pods: list[dict[str, Any]], calls: list[str]) -> dict[str, Any]:
    """The file's content: ``state`` with its pods as ``pod_record``s, and ``calls``."""
    return {
        "version_note": state.version_note,
        "remotes": [
            {k: str(v) for k, v in asdict(r).items() if v is not None}
            for r in state.remotes.values()
        ],
        "pods": pods,
        "calls": calls,
        "policy_fingerprint": state.policy_fingerprint,
    }


def _remote(data: dict[str, str]) -> RemoteNode:
    return RemoteNode(
        data["name"], IPv4Address(data["node_ip"]), IPv4Network(data["subnet"]), data.get("mac")
    )


def _attachment(data: dict[str, Any]) -> PodAttachment:
    return PodAttachment(
        container_id=data["container_id"],
        host_ifname=data["host_ifname"],
        ifname=data["ifname"],
        mac=data["mac"],
        sandbox=data["sandbox"],
        address=IPv4Interface(data["address"]),
        gateway=IPv4Address(data["gateway"]),
        mtu=int(data["mtu"]),
    )
