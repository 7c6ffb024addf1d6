"""coordination.k8s.io/v1 Lease: what a node heartbeats with.

A node agent renews the Lease named after its node in namespace ``kube-node-lease``; the
master's node lifecycle controller reads ``renewTime`` changes (``podnet.controllers
.nodelifecycle``). The shape is Kubernetes', so ``kubectl get leases`` works.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator

from podnet.model.kinds import LEASE
from podnet.model.schemas_common import Open, Schema, Strict, fail
from podnet.model.schemas_types import in_range

MAX_INT32 = (1 << 31) - 1
NODE_LEASE_NAMESPACE = "kube-node-lease"
# The Lease the controllers elect their leader with when they run as their own process.
CONTROLLERS_LEASE_NAMESPACE = "kube-system"
CONTROLLERS_LEASE_NAME = "podnet-controllers"


def _micro_time(value: str) -> str:
    """An RFC 3339 time (Kubernetes' MicroTime: fractional seconds allowed)."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        fail(f'"{value[:64]}" is not an RFC 3339 time')
    if parsed.tzinfo is None:
        fail(f'"{value[:64]}" has no time zone')
    return value


MicroTime = Annotated[str, AfterValidator(_micro_time)]
Seconds = Annotated[int, AfterValidator(in_range(1, MAX_INT32))]
Count = Annotated[int, AfterValidator(in_range(0, MAX_INT32))]


class LeaseSpec(Open):
    holderIdentity: str | None = None
    leaseDurationSeconds: Seconds | None = None
    acquireTime: MicroTime | None = None
    renewTime: MicroTime | None = None
    leaseTransitions: Count | None = None


class LeaseBody(Strict):
    spec: LeaseSpec | None = None


SCHEMAS: dict[str, Schema] = {LEASE.kind: Schema(LeaseBody)}
