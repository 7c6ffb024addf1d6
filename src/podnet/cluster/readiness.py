"""Pod readiness for the local cluster, as a kubelet computes it (pure, no I/O).

A pod started by ``podnet pod run`` may carry a readiness check: a TCP port that must
accept a connection, or a shell command that must exit 0. ``ReadinessCheck`` says which,
and how often (``period``), how long one probe may take (``timeout``) and how many results
in a row flip the state (``successes``/``failures``, Kubernetes' thresholds).
``ReadinessTracker`` is the state machine: a pod starts not ready, and a streak of the
opposite result as long as the threshold flips it. ``ready_conditions`` renders the
Pod's ``Ready`` and ``ContainersReady`` conditions (and the container's status) the way
the kubelet writes them, keeping ``lastTransitionTime`` while a condition holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

CONTAINER = "main"
READY = "Ready"
CONTAINERS_READY = "ContainersReady"
OWN_TYPES = (CONTAINERS_READY, READY)
MIN_PERIOD = 0.1
MAX_PERIOD = 300.0
MAX_THRESHOLD = 100

Obj = Mapping[str, Any]


class ReadinessError(ValueError):
    """A readiness check is malformed (the message says which part)."""


@dataclass(frozen=True)
class ReadinessCheck:
    """A pod's readiness check: exactly one of ``tcp_port`` and ``command``."""

    tcp_port: int | None = None
    command: str | None = None
    period: float = 1.0
    timeout: float = 1.0
    successes: int = 1
    failures: int = 3

    def __post_init__(self) -> None:
        problem = check_problem(self)
        if problem:
            raise ReadinessError(problem)

    def probe_spec(self) -> dict[str, Any]:
        """The check as the container's ``readinessProbe`` (whole seconds, at least 1)."""
        action: dict[str, Any] = (
            {"tcpSocket": {"port": self.tcp_port}}
            if self.tcp_port is not None
            else {"exec": {"command": ["sh", "-c", self.command]}}
        )
        return {
            **action,
            "periodSeconds": max(1, math.ceil(self.period)),
            "timeoutSeconds": max(1, math.ceil(self.timeout)),
            "successThreshold": self.successes,
            "failureThreshold": self.failures,
        }

    def describe(self) -> str:
        """One line for humans: ``tcp :8080 every 1s`` or ``exec 'test -f x' every 1s``."""
        what = f"tcp :{self.tcp_port}" if self.tcp_port is not None else f"exec {self.command!r}"
        return f"{what} every {self.period:g}s"


def check_problem(check: ReadinessCheck) -> str | None:
    """Why ``check`` is malformed, or None."""
    if (check.tcp_port is None) == (check.command is None):
        return "give exactly one of a TCP port and a command"
    if check.tcp_port is not None and not 1 <= check.tcp_port <= 65535:
        return f"TCP port {check.tcp_port} is not in 1..65535"
    if check.command is not None and not check.command.strip():
        return "the command is empty"
    if not MIN_PERIOD <= check.period <= MAX_PERIOD:
        return f"period {check.period:g}s is not in {MIN_PERIOD:g}..{MAX_PERIOD:g}s"
    if not MIN_PERIOD <= check.timeout <= check.period:
        return f"timeout {check.timeout:g}s is not in {MIN_PERIOD:g}s..the period"
    for label, value in (("success", check.successes), ("failure", check.failures)):
        if not 1 <= value <= MAX_THRESHOLD:
            return f"{label} threshold {value} is not in 1..{MAX_THRESHOLD}"
    return None


@dataclass
class ReadinessTracker:
    """Ready or not from probe results: ``successes`` in a row make a not-ready pod
    ready, ``failures`` in a row make a ready pod not ready. Starts not ready."""

    successes: int = 1
    failures: int = 3
    ready: bool = False
    streak: int = 0  # results in a row that disagree with ``ready``

    def observe(self, ok: bool) -> bool:
        """Record one probe result; True if ``ready`` flipped."""
        if ok == self.ready:
            self.streak = 0
            return False
        self.streak += 1
        if self.streak < (self.successes if ok else self.failures):
            return False
        self.ready, self.streak = ok, 0
        return True

    def stopped(self) -> bool:
        """The container is gone: not ready at once; True if ``ready`` flipped."""
        flipped, self.ready, self.streak = self.ready, False, 0
        return flipped


def rfc3339(moment: datetime) -> str:
    """``moment`` as the API writes times: UTC, whole seconds, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, ready: bool, now: str, old: Obj | None) -> dict[str, Any]:
    status = "True" if ready else "False"
    same = old is not None and old.get("status") == status and old.get("lastTransitionTime")
    condition: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": old["lastTransitionTime"] if same and old else now,
    }
    if not ready:
        condition["reason"] = "ContainersNotReady"
        condition["message"] = f"containers with unready status: [{CONTAINER}]"
    return condition


def ready_conditions(ready: bool, now: str, old: Sequence[Obj] = ()) -> list[dict[str, Any]]:
    """``status.conditions`` with ``Ready`` and ``ContainersReady`` set to ``ready``; other
    conditions in ``old`` stay, and a condition that keeps its status keeps its
    ``lastTransitionTime``. ``now`` is an RFC 3339 time."""
    by_type = {str(c.get("type")): c for c in old if isinstance(c, Mapping)}
    kept = [dict(c) for t, c in by_type.items() if t not in OWN_TYPES]
    return kept + [_condition(t, ready, now, by_type.get(t)) for t in OWN_TYPES]


def container_statuses(ready: bool, running: bool) -> list[dict[str, Any]]:
    """``status.containerStatuses`` for the pod's one container."""
    state = {"running": {}} if running else {"terminated": {"reason": "Completed"}}
    return [{"name": CONTAINER, "ready": ready, "started": running, "state": state}]


def readiness_status(
    ready: bool, running: bool, now: str, old_status: Obj | None = None
) -> dict[str, Any]:
    """The part of ``status`` that readiness owns, as a merge patch."""
    old = (old_status or {}).get("conditions") or []
    return {
        "conditions": ready_conditions(ready, now, old),
        "containerStatuses": container_statuses(ready, running),
    }
