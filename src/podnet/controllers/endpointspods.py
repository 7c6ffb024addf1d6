"""Pods as the endpoints controller keeps them: only what endpoints are made of, small.

The controller holds every pod of the cluster (150,000 in the scale runs), so a pod is
cut down to its identity and labels, node, hostname, subdomain, restart policy, container
ports, phase, IPs and Ready condition, in the same dict shape the pure functions read.
What many pods hold alike is held once: strings are interned, and equal label maps,
port lists and Ready conditions are one shared object each (read only: nothing in the
controller changes a pod). A typical pod goes from about 2.6 KB to about 1 KB.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Mapping
from typing import Any, TypeVar

from podnet.controllers.endpointsdesired import Obj, meta_of, spec_of

T = TypeVar("T")
MAX_SHARED = 200_000  # distinct shared values remembered before starting afresh


def _text(value: Any) -> str:
    return sys.intern(str(value))


def _port(port: Mapping[str, Any]) -> tuple[str, int, str]:
    """A container port as (name, number, protocol)."""
    name, number = _text(port.get("name") or ""), int(port.get("containerPort") or 0)
    return name, number, _text(port.get("protocol") or "TCP")


class PodShrinker:
    """Turns API pods into small read-only pods, sharing what pods have in common."""

    def __init__(self) -> None:
        self._shared: dict[Hashable, Any] = {}

    def _one(self, key: Hashable, value: T) -> T:
        found = self._shared.get(key)
        if found is None:
            if len(self._shared) >= MAX_SHARED:
                self._shared.clear()
            self._shared[key] = found = value
        return found

    def __call__(self, pod: Obj) -> dict[str, Any]:
        return {"metadata": self._meta(pod), "spec": self._spec(pod), "status": self._status(pod)}

    def _meta(self, pod: Obj) -> dict[str, Any]:
        meta = meta_of(pod)
        out: dict[str, Any] = {
            "name": str(meta.get("name")),
            "namespace": _text(meta.get("namespace") or ""),
            "resourceVersion": int(meta.get("resourceVersion") or 0),
        }
        if meta.get("uid"):
            out["uid"] = str(meta["uid"])
        if meta.get("deletionTimestamp"):
            out["deletionTimestamp"] = _text(meta["deletionTimestamp"])
        labels = sorted((_text(k), _text(v)) for k, v in (meta.get("labels") or {}).items())
        if labels:
            out["labels"] = self._one(("labels", *labels), dict(labels))
        return out

    def _spec(self, pod: Obj) -> dict[str, Any]:
        spec = spec_of(pod)
        out: dict[str, Any] = {
            field: _text(spec[field])
            for field in ("nodeName", "hostname", "subdomain", "restartPolicy")
            if spec.get(field)
        }
        ports = tuple(
            (
                _text(p.get("name") or ""),
                int(p.get("containerPort") or 0),
                _text(p.get("protocol") or "TCP"),
            )
            for c in spec.get("containers") or []
            for p in c.get("ports") or []
            if isinstance(p, Mapping)
        )
        if ports:
            listed = [{"name": n, "containerPort": c, "protocol": p} for n, c, p in ports]
            out["containers"] = self._one(("ports", *ports), [{"ports": listed}])
        return out

    def _status(self, pod: Obj) -> dict[str, Any]:
        status = pod.get("status") or {}
        out: dict[str, Any] = {}
        if status.get("phase"):
            out["phase"] = _text(status["phase"])
        ips = [str(p["ip"]) for p in status.get("podIPs") or [] if p.get("ip")]
        if len(ips) > 1:
            out["podIPs"] = [{"ip": ip} for ip in ips]
        elif ips or status.get("podIP"):
            out["podIP"] = ips[0] if ips else str(status["podIP"])
        for condition in status.get("conditions") or []:
            if condition.get("type") == "Ready":
                state = _text(condition.get("status"))
                out["conditions"] = self._one(
                    ("ready", state), [{"type": "Ready", "status": state}]
                )
        return out
