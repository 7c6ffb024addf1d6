"""``podnet trace SRC svc/NS/NAME`` (or SRC to a cluster IP): the CLI side of
``podnet.policy.servicetrace``: read the Services and the traced one's Endpoints, and with
``--probe`` send real packets from the source pod, to each ready endpoint (each must do
what its verdict says) and to the service address (which must connect when every
endpoint allows it and fail when none does; with mixed verdicts either is right).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from podnet.model.kinds import ENDPOINTS, SERVICE
from podnet.policy.evaluate import Verdict
from podnet.policy.servicetrace import (
    Backend,
    ServiceRoute,
    backend_verdicts,
    expected_reach,
    find_service,
    may_be_service,
    service_route,
)
from podnet.policy.trace import ClusterObjects, Target, compare, resolve

if TYPE_CHECKING:
    from podnet.cluster.matrix import Endpoint as ProbeSource

Verdicts = list[tuple[Backend, Verdict]]


def _endpoints(client: Any, key: str) -> dict[str, Any] | None:
    from podnet.client import StatusError

    namespace, _, name = key.partition("/")
    try:
        return dict(client.get(ENDPOINTS, namespace, name))
    except StatusError as exc:
        if exc.code != 404:
            raise
        return None


def service_trace(
    client: Any, objects: ClusterObjects, ends: Sequence[str], kind: tuple[str, int | None]
) -> tuple[Target, ServiceRoute, Verdicts] | None:
    """The source, route and per-endpoint verdicts when DST is a Service (by name or by
    its cluster or external IP); None when DST is something else."""
    if not may_be_service(ends[1]):
        return None
    services = list(client.list(SERVICE).get("items") or [])
    found = find_service(ends[1], services)
    if found is None:
        return None
    service, address = found
    protocol, port = kind
    given = None if protocol == "ICMP" else protocol
    src = resolve(ends[0], objects.pods)
    meta = service.get("metadata") or {}
    endpoints = _endpoints(client, f"{meta.get('namespace')}/{meta.get('name')}")
    route = service_route(service, address, endpoints, port, given)
    return src, route, backend_verdicts(objects.ruleset(), src.ip, route)


def probe_service(source: ProbeSource, route: ServiceRoute, verdicts: Verdicts) -> list[str]:
    """Probe lines; a line with ``DISAGREEMENT`` marks a data plane bug."""
    from podnet.cluster import matrix

    lines = []
    for backend, verdict in verdicts:
        outcome = matrix.probe(source, str(backend.ip), route.protocol, backend.port)
        lines.append(f"{backend.ip}:{backend.port}: {compare(verdict.allowed, outcome).line()}")
    outcome = matrix.probe(source, route.address, route.protocol, route.port)
    expected = expected_reach(verdicts)
    where = f"{route.address}:{route.port}"
    if expected is None:
        seen = "connected" if outcome.ok else "no answer"
        lines.append(f"{where}: probe: {seen} (mixed verdicts: either is right)")
    else:
        lines.append(f"{where}: {compare(expected, outcome).line()}")
    return lines
