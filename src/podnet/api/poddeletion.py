"""Graceful Pod deletion, as Kubernetes does it (pure; the registry applies the plan).

A DELETE of a Pod bound to a node does not remove it: it sets
``metadata.deletionTimestamp`` (now + grace) and ``deletionGracePeriodSeconds``, and the
node that runs the pod finalizes it once the pod's sandbox network is gone (a CNI DEL,
or the node tearing it down when the grace runs out), by deleting it again with grace 0
and a UID precondition. The grace is ``DeleteOptions.gracePeriodSeconds``, else
``spec.terminationGracePeriodSeconds``, else 30.

Removed at once: grace 0 (``kubectl delete --force --grace-period=0``), a pod bound to no
node or to a node that does not exist, a pod in a finished phase (kube's
``CheckGracefulDelete``), a mirror pod (it only reports a node's sandbox; its node's
orphan teardown follows the removal), and a pod whose grace has already run out (so a
node that is down does not keep its pods, and their namespace, for ever: its agent
tears the sandboxes down when it comes back, as it does for every pod without an
object). A second DELETE may shorten the grace, never lengthen it. A grace over a century counts as
a century (timestamps end at the year 9999).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

Obj = dict[str, Any]
DEFAULT_GRACE_SECONDS = 30
MAX_GRACE_SECONDS = 100 * 365 * 86400  # larger graces (up to int64) are this: dates end
FINISHED_PHASES = ("Succeeded", "Failed")
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_STAMP = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class PodDeletion:
    """What a DELETE does to a Pod: remove it now, or store ``marked`` (None: as it is)."""

    remove: bool
    marked: Obj | None = None


def spec_grace(pod: Obj) -> int:
    """``spec.terminationGracePeriodSeconds`` when it is a non-negative integer, else 30."""
    value = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    if type(value) is int and value >= 0:
        return value
    return DEFAULT_GRACE_SECONDS


def deletion_deadline(pod: Obj) -> datetime | None:
    """When a terminating pod's grace runs out (None: not terminating, or unreadable)."""
    stamp = (pod.get("metadata") or {}).get("deletionTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.strptime(stamp, _STAMP).replace(tzinfo=UTC)
    except ValueError:
        return None


def _stamp(when: datetime) -> str:
    return when.strftime(_STAMP)


def immediate(pod: Obj, node_exists: bool) -> bool:
    """Whether no node can be running this pod's sandbox under API control."""
    spec = pod.get("spec") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    phase = (pod.get("status") or {}).get("phase")
    return (
        not spec.get("nodeName")
        or not node_exists
        or phase in FINISHED_PHASES
        or MIRROR_ANNOTATION in annotations
    )


def plan_pod_deletion(
    pod: Obj, requested_grace: int | None, node_exists: bool, now: datetime
) -> PodDeletion:
    """What a DELETE with ``requested_grace`` (None: not given) does to ``pod`` at ``now``."""
    grace = spec_grace(pod) if requested_grace is None else requested_grace
    grace = min(grace, MAX_GRACE_SECONDS)
    if grace == 0 or immediate(pod, node_exists):
        return PodDeletion(remove=True)
    now = now.replace(microsecond=0)
    wanted = now + timedelta(seconds=grace)
    deadline = deletion_deadline(pod)
    if deadline is not None:
        if deadline <= now:
            return PodDeletion(remove=True)  # its grace ran out: whoever may delete, does
        if wanted >= deadline:
            return PodDeletion(remove=False)  # a later DELETE never lengthens the grace
    meta = {**pod["metadata"], "deletionTimestamp": _stamp(wanted)}
    meta["deletionGracePeriodSeconds"] = grace
    return PodDeletion(remove=False, marked={**pod, "metadata": meta})
