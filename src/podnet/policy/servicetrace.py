"""``podnet trace`` through a Service: which endpoints a packet to a cluster IP may be sent
to, and the policy verdict for each (pure: objects in, values and text out).

The service proxy picks one ready endpoint at random and DNATs the packet to it;
NetworkPolicy and isolation then apply to that backend pod and its target port, as in
Kubernetes. So a trace to ``svc/NS/NAME`` (or to a cluster or external IP) lists the
Service's port, every ready endpoint (a candidate) with its verdict, and the not-ready
ones (never picked). With no ready endpoint the proxy rejects the connection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Any

from podnet.policy.evaluate import Packet, Verdict, evaluate
from podnet.policy.model import RuleSet
from podnet.policy.trace import TraceError

Obj = Mapping[str, Any]
SERVICE_PREFIXES = ("svc/", "service/", "services/")


@dataclass(frozen=True)
class Backend:
    """One endpoint address of the traced Service port."""

    ip: IPv4Address
    port: int
    ready: bool
    pod: str | None = None  # namespace/name from the targetRef
    node: str | None = None


@dataclass(frozen=True)
class ServiceRoute:
    """The traced Service port and the endpoints behind it."""

    service: str  # namespace/name
    address: str  # the cluster (or external) IP traced
    port: int
    protocol: str
    port_name: str
    target: str  # the targetPort as written (a number or a name)
    affinity: str
    backends: tuple[Backend, ...]

    @property
    def ready(self) -> list[Backend]:
        return [b for b in self.backends if b.ready]


def service_name(text: str) -> tuple[str, str] | None:
    """``svc/NS/NAME`` (or ``service/``, ``services/``) as (namespace, name); None for
    anything else; TraceError for a malformed one."""
    prefix = next((p for p in SERVICE_PREFIXES if text.startswith(p)), None)
    if prefix is None:
        return None
    namespace, sep, name = text[len(prefix) :].partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise TraceError(f"{text!r}: expected svc/NAMESPACE/NAME")
    return namespace, name


def may_be_service(text: str) -> bool:
    """Whether ``text`` names a Service or is an address a Service may have (so the
    Services are worth reading): ``svc/...`` or an IPv4 address."""
    if text.startswith(SERVICE_PREFIXES):
        return True
    try:
        IPv4Address(text)
    except ValueError:
        return False
    return True


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def _key(obj: Obj) -> str:
    return f"{_meta(obj).get('namespace')}/{_meta(obj).get('name')}"


def find_service(text: str, services: Sequence[Obj]) -> tuple[Obj, str] | None:
    """The Service ``text`` names (``svc/NS/NAME``) or whose cluster or external IP it is,
    with the address traced; None when ``text`` is neither (a pod or another address)."""
    named = service_name(text)
    for service in services:
        spec = service.get("spec") or {}
        ips = [spec.get("clusterIP"), *(spec.get("externalIPs") or [])]
        if named is not None and _key(service) == "/".join(named):
            return service, str(spec.get("clusterIP") or "")
        if named is None and text in ips:
            return service, text
    if named is not None:
        raise TraceError(f'service "{named[1]}" not found in namespace "{named[0]}"')
    return None


def _service_port(spec: Obj, port: int | None, protocol: str | None) -> Obj:
    ports = [p for p in spec.get("ports") or [] if isinstance(p, Mapping)]
    wanted = [
        p
        for p in ports
        if (port is None or p.get("port") == port)
        and (protocol is None or str(p.get("protocol") or "TCP") == protocol)
    ]
    if len(wanted) == 1:
        return wanted[0]
    listed = ", ".join(f"{p.get('port')}/{p.get('protocol') or 'TCP'}" for p in ports)
    if not wanted:
        raise TraceError(f"the service has no port {port or ''}/{protocol or ''}; it has {listed}")
    raise TraceError(f"the service has several ports ({listed}): give --port")


def _backends(endpoints: Obj | None, port_name: str) -> list[Backend]:
    found: list[Backend] = []
    for subset in (endpoints or {}).get("subsets") or []:
        ports = [p for p in subset.get("ports") or [] if str(p.get("name") or "") == port_name]
        for port in ports:
            for field, ready in (("addresses", True), ("notReadyAddresses", False)):
                for address in subset.get(field) or []:
                    ref = address.get("targetRef") or {}
                    pod = f"{ref.get('namespace')}/{ref.get('name')}" if ref.get("name") else None
                    found.append(
                        Backend(
                            IPv4Address(str(address.get("ip"))),
                            int(port["port"]),
                            ready,
                            pod,
                            address.get("nodeName"),
                        )
                    )
    return found


def service_route(
    service: Obj,
    address: str,
    endpoints: Obj | None,
    port: int | None,
    protocol: str | None,
) -> ServiceRoute:
    """The route of a packet to ``address`` (the Service's cluster or external IP) on
    ``port``/``protocol`` (None: the Service's only port); TraceError for a Service that
    has no cluster IP (headless, ExternalName) or no such port."""
    spec = service.get("spec") or {}
    kind = str(spec.get("type") or "ClusterIP")
    if kind == "ExternalName":
        raise TraceError(f"service {_key(service)} is ExternalName: it has no cluster IP")
    if not address or address == "None":
        raise TraceError(f"service {_key(service)} is headless: trace its pods instead")
    chosen = _service_port(spec, port, protocol)
    name = str(chosen.get("name") or "")
    return ServiceRoute(
        service=_key(service),
        address=address,
        port=int(chosen["port"]),
        protocol=str(chosen.get("protocol") or "TCP"),
        port_name=name,
        target=str(chosen.get("targetPort", chosen["port"])),
        affinity=str(spec.get("sessionAffinity") or "None"),
        backends=tuple(_backends(endpoints, name)),
    )


def backend_verdicts(
    ruleset: RuleSet, src: IPv4Address, route: ServiceRoute
) -> list[tuple[Backend, Verdict]]:
    """The policy verdict for each ready endpoint: after DNAT, to the pod's target port."""
    return [(b, evaluate(ruleset, src, b.ip, route.protocol, b.port)) for b in route.ready]


def expected_reach(verdicts: Sequence[tuple[Backend, Verdict]]) -> bool | None:
    """Whether a connection to the service gets through: True if every ready endpoint
    allows it, False if none does (or there is none: the proxy rejects), None if mixed."""
    allowed = {verdict.allowed for _, verdict in verdicts}
    if not allowed:
        return False
    return allowed.pop() if len(allowed) == 1 else None


def _backend_line(backend: Backend, verdict: Verdict | None) -> str:
    who = f"{backend.ip}:{backend.port}"
    where = " ".join(x for x in (backend.pod, f"({backend.node})" if backend.node else "") if x)
    if verdict is None:
        return f"  not ready  {who}  {where}  (never picked)".rstrip()
    head = "ALLOWED" if verdict.allowed else "DENIED "
    why = (
        f"allowed by: {', '.join(verdict.allowed_by)}"
        if verdict.allowed and verdict.allowed_by
        else (f"denied because: {verdict.denied_because}" if not verdict.allowed else "")
    )
    return f"  {head}    {who}  {where}  {why}".rstrip()


def render_service_trace(
    src: str, route: ServiceRoute, verdicts: Sequence[tuple[Backend, Verdict]]
) -> str:
    """The ``podnet trace SRC svc/...`` answer."""
    service = Packet.service_text(route.protocol, route.port)
    name = f' "{route.port_name}"' if route.port_name else ""
    lines = [
        f"service {route.service}: {src} -> {route.address} {service} (port{name}, "
        f"targetPort {route.target}, session affinity {route.affinity})",
    ]
    ready, waiting = route.ready, [b for b in route.backends if not b.ready]
    lines.append(f"endpoints: {len(ready)} ready (picked at random), {len(waiting)} not ready")
    lines += [_backend_line(b, v) for b, v in verdicts]
    lines += [_backend_line(b, None) for b in waiting]
    reach = expected_reach(verdicts)
    if not ready:
        lines.append("REJECTED: no ready endpoint; the proxy answers with a reset/unreachable")
    elif reach is None:
        allowed = sum(v.allowed for _, v in verdicts)
        lines.append(f"MIXED: {allowed} of {len(ready)} endpoints allow it; it depends on the pick")
    else:
        lines.append(f"{'ALLOWED' if reach else 'DENIED'}: every ready endpoint agrees")
    return "\n".join(lines)
