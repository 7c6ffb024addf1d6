"""Discovery documents (/api, /apis, /api/v1, /apis/<group>/<version>) built from the kinds."""

from __future__ import annotations

from typing import Any

from podnet.api import access_review
from podnet.api.authorizer import AUTHORIZATION_GROUP
from podnet.model.kinds import KINDS, Kind

VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def api_versions(server_address: str) -> dict[str, Any]:
    """``GET /api``: the core group's versions."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for kind in KINDS.kinds:
        if kind.group:
            versions = groups.setdefault(kind.group, [])
            if kind.version not in versions:
                versions.append(kind.version)
    # Served by handlers of their own, not the kinds table: access reviews (can-i).
    groups.setdefault(AUTHORIZATION_GROUP, ["v1"])
    return groups


def api_group(group: str) -> dict[str, Any] | None:
    """``GET /apis/<group>``, or None for an unknown group."""
    versions = _groups().get(group)
    if versions is None:
        return None
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": entries,
        "preferredVersion": entries[0],
    }


def api_group_list() -> dict[str, Any]:
    """``GET /apis``: every named group."""
    groups = [api_group(name) for name in _groups()]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _resource(kind: Kind) -> list[dict[str, Any]]:
    entry: dict[str, Any] = {
        "name": kind.plural,
        "singularName": kind.singular,
        "namespaced": kind.namespaced,
        "kind": kind.kind,
        "verbs": VERBS,
    }
    if kind.short_names:
        entry["shortNames"] = list(kind.short_names)
    out = [entry]
    for sub in kind.subresources:
        out.append(
            {
                "name": f"{kind.plural}/{sub}",
                "singularName": "",
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": ["get", "patch", "update"],
            }
        )
    return out


def api_resource_list(group_version: str) -> dict[str, Any] | None:
    """``GET /api/v1`` or ``/apis/<group>/<version>``, or None if unknown."""
    kinds = KINDS.group_versions().get(group_version)
    if group_version == access_review.API_VERSION:
        resources = access_review.discovery_resources()
    elif not kinds:
        return None
    else:
        resources = [r for kind in kinds for r in _resource(kind)]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }
