"""The API objects as the policy compiler reads them, and nothing more ("slim" objects).

The agent keeps every pod, Namespace, NetNamespace and NetworkPolicy of the cluster, so a
kept object holds only the fields compile reads. A pod keeps its name, namespace, uid,
labels, node, hostNetwork, named container ports, IP and phase; strings that repeat
across pods (namespaces, nodes, labels) are interned.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from podnet.policy.compile import object_key, pod_address

Obj = Mapping[str, Any]
Slim = dict[str, Any]

PODS, NAMESPACES, NETNAMESPACES, POLICIES = "pods", "namespaces", "netnamespaces", "policies"
COLLECTIONS = (PODS, NAMESPACES, NETNAMESPACES, POLICIES)


def _text(value: Any) -> Any:
    return sys.intern(value) if isinstance(value, str) else value


def _labels(labels: Any) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in (labels or {}).items()}


def _port_number(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None  # the API refuses it; compile_rules would raise


def _named_container_ports(spec: Obj) -> list[Slim]:
    """Every named port of every container, in order (a later duplicate wins in compile)."""
    found = []
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            number = _port_number(port.get("containerPort"))
            if port.get("name") and number is not None:
                protocol = _text(port.get("protocol"))
                found.append({"name": _text(port["name"]), "protocol": protocol,
                              "containerPort": number})  # fmt: skip
    return found


def slim_pod(pod: Obj) -> Slim:
    """The pod as compile reads it; one container holds every named port, and ``podIP`` is
    parsed (an ``IPv4Address``, or None)."""
    meta, spec, status = (pod.get(part) or {} for part in ("metadata", "spec", "status"))
    ports = _named_container_ports(spec)
    return {
        "metadata": {"namespace": _text(meta.get("namespace")), "name": meta.get("name"),
                     "uid": meta.get("uid"), "labels": _labels(meta.get("labels"))},
        "spec": {"nodeName": _text(spec.get("nodeName")),
                 "hostNetwork": bool(spec.get("hostNetwork")),
                 "containers": [{"ports": ports}] if ports else []},
        "status": {"podIP": pod_address(status.get("podIP")),
                   "phase": _text(status.get("phase"))},
    }  # fmt: skip


def slim_namespace(namespace: Obj) -> Slim:
    """The namespace's name and labels."""
    meta = namespace.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "labels": _labels(meta.get("labels"))}}


def slim_netnamespace(netns: Obj) -> Slim:
    """The NetNamespace's project name and VNID."""
    name = netns.get("netname") or (netns.get("metadata") or {}).get("name")
    return {"netname": _text(name), "netid": netns.get("netid")}


def slim_policy(policy: Obj) -> Slim:
    """The policy's namespace, name and spec (a change elsewhere changes no rule)."""
    namespace, name = object_key(policy)
    return {"metadata": {"namespace": namespace, "name": name}, "spec": policy.get("spec") or {}}


SLIM: dict[str, Callable[[Obj], Slim]] = {
    PODS: slim_pod,
    NAMESPACES: slim_namespace,
    NETNAMESPACES: slim_netnamespace,
    POLICIES: slim_policy,
}


def object_name(collection: str, obj: Obj) -> str:
    """The key of ``obj`` in its collection: ``namespace/name``, or the project name of a
    NetNamespace (what compile looks VNIDs up by)."""
    if collection == NETNAMESPACES:
        return str(obj.get("netname") or (obj.get("metadata") or {}).get("name") or "")
    namespace, name = object_key(obj)
    return f"{namespace}/{name}"


def same_address(old: Slim | None, new: Slim) -> Slim:
    """``new``, holding ``old``'s very address object when a pod keeps its IP: the sets
    of a rebuilt view then hold the same objects, and compare at C speed."""
    status = new.get("status")
    if old is not None and status is not None and old["status"]["podIP"] == status["podIP"]:
        status["podIP"] = old["status"]["podIP"]
    return new
