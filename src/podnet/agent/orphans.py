"""Which sandboxes on this node lost their Pod, and which Pods this node may finalize
(pure; ``podnet.agent.podlifecycle`` applies the plan).

- An attachment whose Pod object is gone (deleted, or bound elsewhere now) is an
  orphan: its network is torn down (detached, its address released). The runtime's
  process may live on, without a network: a quarantine. A Pod this node has not seen
  yet may still come (a mirror Pod its status write creates): not while that write is
  pending, nor in the ``settle`` seconds after the ADD.
- An attachment whose Pod's grace has run out (``deletionTimestamp`` passed) is torn
  down the same way, and the Pod is finalized.
- A terminating Pod bound to this node with no attachment here (its CNI DEL happened, or
  it never had a sandbox) is finalized: deleted with grace 0 and its uid as
  precondition, as the kubelet's last delete does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from podnet.agent.podrefs import Pair
from podnet.agent.podstatus import PodRef
from podnet.api.podaddresses import pod_ips
from podnet.api.poddeletion import deletion_deadline

Obj = dict[str, Any]
SETTLE_SECONDS = 30.0  # an ADD's Pod may be created (a mirror) or bound this long after
ORPHAN = "pod object gone"
GRACE_OVER = "grace period over"


@dataclass(frozen=True)
class KnownPod:
    """What the lifecycle keeps of one of this node's Pods."""

    uid: str
    deadline: datetime | None  # when its grace runs out; None: not terminating


@dataclass(frozen=True)
class LifecyclePlan:
    """Attachments to tear down (with why), then Pods to finalize (with their uid)."""

    teardown: list[tuple[Pair, str]]
    finalize: list[tuple[PodRef, str]]


def known_pod(obj: Obj) -> KnownPod:
    """The slim form of a Pod object."""
    meta = obj.get("metadata") or {}
    deadline = None
    if meta.get("deletionTimestamp"):  # unreadable: as good as run out
        deadline = deletion_deadline(obj) or datetime.min.replace(tzinfo=UTC)
    return KnownPod(str(meta.get("uid") or ""), deadline)


def ref_of(obj: Obj) -> PodRef:
    """A Pod object's namespace/name."""
    meta = obj.get("metadata") or {}
    return PodRef(str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def local_ips(obj: Obj, subnet: IPv4Network) -> frozenset[IPv4Address]:
    """The addresses a Pod's status shows inside this node's subnet."""
    found = set()
    for text in pod_ips(obj):
        try:
            ip = IPv4Address(text)
        except ValueError:
            continue
        if ip in subnet:
            found.add(ip)
    return frozenset(found)


def _ran_out(pod: KnownPod, now: datetime) -> bool:
    return pod.deadline is not None and pod.deadline <= now


def plan_lifecycle(
    pods: Mapping[PodRef, KnownPod],
    attachments: Iterable[tuple[Pair, PodRef, float | None]],
    now: datetime,
    monotonic: float,
    pending: Callable[[PodRef], bool],
    seen: Callable[[PodRef], bool] = lambda ref: False,
    settle: float = SETTLE_SECONDS,
) -> LifecyclePlan:
    """What to do now, from this node's Pods (``pods``, a complete view) and its
    attachments (pair, Pod, monotonic time of the ADD or None when older than the
    agent). ``pending``: whether a status write for the Pod is still on its way;
    ``seen``: whether this node saw the Pod bound to it since it started."""
    teardown: list[tuple[Pair, str]] = []
    kept: set[PodRef] = set()
    for pair, ref, added in attachments:
        pod = pods.get(ref)
        if pod is None:
            young = added is not None and monotonic - added < settle and not seen(ref)
            if young or pending(ref):
                kept.add(ref)
            else:
                teardown.append((pair, ORPHAN))
        elif _ran_out(pod, now):
            teardown.append((pair, GRACE_OVER))
        else:
            kept.add(ref)
    finalize = [
        (ref, pod.uid)
        for ref, pod in sorted(pods.items(), key=lambda item: str(item[0]))
        if pod.deadline is not None and ref not in kept and pod.uid
    ]
    return LifecyclePlan(teardown, finalize)


def next_deadline(pods: Iterable[KnownPod], now: datetime) -> datetime | None:
    """The earliest grace that has yet to run out after ``now`` (None: none)."""
    found = [p.deadline for p in pods if p.deadline is not None and p.deadline > now]
    return min(found) if found else None
