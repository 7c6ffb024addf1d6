"""Table cells of Routes, as ``oc get routes`` prints them, plus podnet's ADMITTED.

- HOST/PORT: ``spec.host``.
- PATH: ``spec.path``.
- SERVICES: ``spec.to.name``; with alternate backends every service with its share of
  the total weight, rounded down as oc does: ``a(75%),b(25%)`` (all ``0%`` when every
  weight is 0). A missing weight counts as OpenShift's default, 100.
- PORT: ``spec.port.targetPort``, else ``<all>``.
- TERMINATION: ``spec.tls.termination``, with ``/<insecureEdgeTerminationPolicy>`` when
  one is set: ``edge``, ``passthrough/Redirect``.
- ADMITTED: from the Admitted conditions in ``status.ingress``: ``True`` when every
  router admitted the route, ``False`` when one refused it, empty otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = Mapping[str, Any]
DEFAULT_WEIGHT = 100  # OpenShift's default weight of a backend


def _spec(obj: Obj) -> Obj:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _weight(backend: Obj) -> int:
    weight = backend.get("weight", DEFAULT_WEIGHT)
    return weight if isinstance(weight, int) else 0


def route_services(obj: Obj) -> str:
    """SERVICES: the target, and every alternate backend with its share."""
    spec = _spec(obj)
    target = spec.get("to")
    to: Obj = target if isinstance(target, Mapping) else {}
    alternates = [b for b in spec.get("alternateBackends") or [] if isinstance(b, Mapping)]
    if not alternates:
        return str(to.get("name") or "")
    backends: list[Obj] = [to, *alternates]
    total = sum(_weight(b) for b in backends)
    shares = [_weight(b) * 100 // total if total else 0 for b in backends]
    return ",".join(f"{b.get('name')}({share}%)" for b, share in zip(backends, shares, strict=True))


def route_port(obj: Obj) -> str:
    """PORT: the target port, or ``<all>``."""
    port = _spec(obj).get("port")
    target = port.get("targetPort") if isinstance(port, Mapping) else None
    return "<all>" if target in (None, "", 0) else str(target)


def route_termination(obj: Obj) -> str:
    """TERMINATION: ``edge``, ``reencrypt/Allow``, ``passthrough/Redirect``; empty for
    plain HTTP."""
    tls = _spec(obj).get("tls")
    if not isinstance(tls, Mapping):
        return ""
    termination = str(tls.get("termination") or "")
    policy = tls.get("insecureEdgeTerminationPolicy")
    return f"{termination}/{policy}" if policy else termination


def route_admitted(obj: Obj) -> str:
    """ADMITTED: ``True``, ``False`` or empty, from every router's Admitted condition."""
    status = obj.get("status")
    ingress = status.get("ingress") if isinstance(status, Mapping) else None
    found = []
    for entry in ingress or []:
        conditions = entry.get("conditions") if isinstance(entry, Mapping) else None
        for condition in conditions or []:
            if isinstance(condition, Mapping) and condition.get("type") == "Admitted":
                found.append(condition.get("status"))
    if "False" in found:
        return "False"
    return "True" if found and all(s == "True" for s in found) else ""


PEM_FIELDS = ("certificate", "caCertificate", "destinationCACertificate")


def redacted_route(obj: Obj) -> dict[str, Any]:
    """``obj`` for ``describe``: the TLS key as ``<redacted>`` and each certificate field
    as its size, as ``oc describe route`` shows no PEM (``-o yaml`` still shows it all)."""
    spec = _spec(obj)
    tls = spec.get("tls")
    if not isinstance(tls, Mapping):
        return dict(obj)
    shown = dict(tls)
    if shown.get("key"):
        shown["key"] = "<redacted>"
    for field in PEM_FIELDS:
        if isinstance(shown.get(field), str) and shown[field]:
            shown[field] = f"<PEM, {len(shown[field])} bytes>"
    return {**obj, "spec": {**spec, "tls": shown}}
