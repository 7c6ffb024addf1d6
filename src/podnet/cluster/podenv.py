"""The service environment variables of a pod, as the kubelet sets them (seed 003).

Every Service of the pod's namespace that has a cluster IP (not headless, not
ExternalName), and the ``kubernetes`` Service of ``default`` unless the namespace has its
own of that name, gives the pod's process::

    WEB_SERVICE_HOST=10.0.0.10          WEB_PORT=tcp://10.0.0.10:80
    WEB_SERVICE_PORT=80                 WEB_PORT_80_TCP=tcp://10.0.0.10:80
    WEB_SERVICE_PORT_HTTP=80            WEB_PORT_80_TCP_PROTO=tcp
                                        WEB_PORT_80_TCP_PORT=80
                                        WEB_PORT_80_TCP_ADDR=10.0.0.10

(the name upper-cased, ``-`` as ``_``; ``*_SERVICE_PORT`` and ``*_PORT`` are the first
port; one ``*_SERVICE_PORT_<NAME>`` per named port; the Docker-link ``*_PORT_<port>_<proto>``
group per port). Values are fixed when the pod starts, as in Kubernetes: a Service
created later is found through DNS, not here.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

MASTER_NAMESPACE = "default"
MASTER_SERVICES = frozenset({"kubernetes"})
_VARIABLE = re.compile(r"[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT|PORT)(_[A-Z0-9_]+)?")

Obj = Mapping[str, Any]


def env_name(name: str) -> str:
    """A Service or port name as a variable name part: ``my-svc`` -> ``MY_SVC``."""
    return name.upper().replace("-", "_")


def service_ip(service: Obj) -> str | None:
    """The Service's cluster IP, or None (headless, ExternalName, not allocated)."""
    ip = (service.get("spec") or {}).get("clusterIP")
    if not isinstance(ip, str) or not ip or ip == "None":
        return None
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        return None


def _host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _ports(service: Obj) -> list[Obj]:
    ports = (service.get("spec") or {}).get("ports") or []
    return [p for p in ports if isinstance(p, Mapping) and isinstance(p.get("port"), int)]


def service_variables(service: Obj) -> dict[str, str]:
    """The variables of one Service ({} when it has no cluster IP or no port)."""
    ip, ports = service_ip(service), _ports(service)
    if ip is None or not ports:
        return {}
    name = env_name(str((service.get("metadata") or {}).get("name", "")))
    first = ports[0]
    out = {f"{name}_SERVICE_HOST": ip, f"{name}_SERVICE_PORT": str(first["port"])}
    for port in ports:
        if port.get("name"):
            out[f"{name}_SERVICE_PORT_{env_name(str(port['name']))}"] = str(port["port"])
    for index, port in enumerate(ports):
        proto = str(port.get("protocol") or "TCP")
        url = f"{proto.lower()}://{_host_port(ip, port['port'])}"
        prefix = f"{name}_PORT_{port['port']}_{proto.upper()}"
        if index == 0:
            out[f"{name}_PORT"] = url
        out[prefix] = url
        out[f"{prefix}_PROTO"] = proto.lower()
        out[f"{prefix}_PORT"] = str(port["port"])
        out[f"{prefix}_ADDR"] = ip
    return out


def visible_services(namespace: str, own: Sequence[Obj], master: Iterable[Obj] = ()) -> list[Obj]:
    """The Services a pod of ``namespace`` gets variables for: its namespace's (``own``),
    and the master Services of ``default`` (from ``master``) that ``own`` does not shadow;
    sorted by name."""
    by_name = {str((s.get("metadata") or {}).get("name")): s for s in own}
    if namespace != MASTER_NAMESPACE:
        for service in master:
            name = str((service.get("metadata") or {}).get("name"))
            if name in MASTER_SERVICES and name not in by_name:
                by_name[name] = service
    return [by_name[name] for name in sorted(by_name)]


def service_environment(services: Iterable[Obj]) -> dict[str, str]:
    """Every Service's variables, in one mapping."""
    out: dict[str, str] = {}
    for service in services:
        out.update(service_variables(service))
    return out


def namespace_service_environment(api: Any, namespace: str) -> dict[str, str]:
    """The variables for a pod starting now in ``namespace`` (read from the API)."""
    from podnet.model.kinds import SERVICE

    own = api.list(SERVICE, namespace).get("items") or []
    master: list[Obj] = []
    if namespace != MASTER_NAMESPACE:
        master = api.list(SERVICE, MASTER_NAMESPACE).get("items") or []
    return service_environment(visible_services(namespace, own, master))


def save_environment(path: Path, env: Mapping[str, str]) -> None:
    """Keep the variables a pod started with (root-only, in the hidden state dir), so
    ``pod exec`` gives its commands the same ones, as a container exec does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(env), sort_keys=True))
    tmp.chmod(0o600)
    tmp.replace(path)


def load_environment(path: Path) -> dict[str, str]:
    """The kept variables ({} when there are none); only names a Service can give."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str) and _VARIABLE.fullmatch(str(k))}
