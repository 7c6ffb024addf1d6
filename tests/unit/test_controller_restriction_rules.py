"""ControllerRestriction's object checks, over in-memory lookups (the attacks against a
real master are in tests/integration/test_controller_restriction.py)."""

from __future__ import annotations

from collections.abc import Set
from typing import Any

import pytest

from podnet.api.authorizer import RequestAttributes
from podnet.api.controllerrestriction import ControllerRestriction
from podnet.model import errors
from podnet.model.kinds import (
    ENDPOINT_SLICE,
    ENDPOINTS,
    HOST_SUBNET,
    NAMESPACE,
    NETWORK_POLICY,
    POD,
    SERVICE,
    Kind,
)

Obj = dict[str, Any]
SLICER = "endpointslice-controller.k8s.io"
MIRROR = "endpointslicemirroring-controller.k8s.io"
POD_IPS = {"10.128.0.5": {"shop/web-1"}, "10.128.1.9": {"other/db-1"}}


def service(name: str, selector: dict[str, str] | None, **spec: Any) -> Obj:
    return {"metadata": {"name": name, "namespace": "shop"}, "spec": {"selector": selector, **spec}}


OBJECTS: dict[tuple[str, str | None, str], Obj] = {
    ("namespaces", None, "shop"): {"metadata": {"name": "shop"}},
    ("namespaces", None, "gone-soon"): {
        "metadata": {"name": "gone-soon", "deletionTimestamp": "2026-01-01T00:00:00Z"}
    },
    ("services", "shop", "web"): service("web", {"app": "web"}),
    ("services", "shop", "ext"): service("ext", None),
    ("services", "shop", "cname"): service("cname", {"a": "b"}, type="ExternalName"),
    ("endpoints", "shop", "ext"): {
        "metadata": {"name": "ext", "namespace": "shop"},
        "subsets": [{"addresses": [{"ip": "192.0.2.7"}]}],
    },
}


async def get(kind: Kind, namespace: str | None, name: str) -> Obj:
    try:
        return OBJECTS[(kind.plural, namespace, name)]
    except KeyError:
        raise errors.not_found(kind.plural, name) from None


async def holders(ips: Set[str]) -> dict[str, set[str]]:
    return {ip: POD_IPS.get(ip, set()) for ip in ips}


RESTRICTION = ControllerRestriction(get, holders)


def endpoint_slice(service_name: str, managed_by: str, *ips: str) -> Obj:
    labels = {"kubernetes.io/service-name": service_name}
    if managed_by:
        labels["endpointslice.kubernetes.io/managed-by"] = managed_by
    return {
        "metadata": {"name": f"{service_name}-x", "namespace": "shop", "labels": labels},
        "endpoints": [{"addresses": [ip]} for ip in ips],
    }


def endpoints(name: str, *ips: str, managed: bool = False) -> Obj:
    labels = {"endpoints.kubernetes.io/managed-by": "endpoint-controller"} if managed else {}
    return {
        "metadata": {"name": name, "namespace": "shop", "labels": labels},
        "subsets": [{"notReadyAddresses": [{"ip": ip} for ip in ips]}],
    }


async def why(
    verb: str, kind: Kind, new: Obj | None = None, old: Obj | None = None, ns: str = "shop"
) -> str | None:
    name = ((new or old or {}).get("metadata") or {}).get("name")
    attrs = RequestAttributes(verb, kind, ns if kind.namespaced else None, name, None, new, old)
    return await RESTRICTION.why_not(attrs)


async def test_slices_of_selector_services_hold_only_pods_of_the_namespace() -> None:
    assert await why("create", ENDPOINT_SLICE, endpoint_slice("web", SLICER, "10.128.0.5")) is None
    for ip in ("203.0.113.9", "10.128.1.9"):  # outside; a pod of another namespace
        reason = await why("create", ENDPOINT_SLICE, endpoint_slice("web", SLICER, ip))
        assert reason is not None and f"{ip} is no pod's in namespace shop" in reason


@pytest.mark.parametrize(
    ("name", "managed_by"),
    [("web", "someone"), ("web", ""), ("web", MIRROR), ("ext", SLICER), ("nope", SLICER)],
)
async def test_other_slices_are_refused(name: str, managed_by: str) -> None:
    reason = await why("create", ENDPOINT_SLICE, endpoint_slice(name, managed_by, "10.128.0.5"))
    assert reason is not None and "managed-by" in reason


async def test_mirrored_slices_hold_only_the_hand_written_endpoints() -> None:
    assert await why("create", ENDPOINT_SLICE, endpoint_slice("ext", MIRROR, "192.0.2.7")) is None
    reason = await why("create", ENDPOINT_SLICE, endpoint_slice("ext", MIRROR, "203.0.113.9"))
    assert reason is not None and "203.0.113.9 is not one" in reason


async def test_an_update_takes_over_no_slice() -> None:
    mine = endpoint_slice("web", SLICER, "10.128.0.5")
    foreign = endpoint_slice("web", "someone", "10.128.0.5")
    assert await why("update", ENDPOINT_SLICE, mine, mine) is None
    assert await why("update", ENDPOINT_SLICE, mine, foreign) is not None


async def test_endpoints_only_of_selector_services_with_pods() -> None:
    assert await why("update", ENDPOINTS, endpoints("web", "10.128.0.5")) is None
    assert await why("update", ENDPOINTS, endpoints("web", "203.0.113.9")) is not None
    for name in ("ext", "cname", "nope"):
        reason = await why("create", ENDPOINTS, endpoints(name, "10.128.0.5"))
        assert reason is not None and "with a selector" in reason


async def test_deletes_only_in_ending_namespaces_but_managed_endpoints() -> None:
    pod = {"metadata": {"name": "p", "namespace": "shop"}}
    policy = {"metadata": {"name": "deny", "namespace": "shop"}}
    for kind, old in ((POD, pod), (NETWORK_POLICY, policy), (SERVICE, service("web", None))):
        reason = await why("delete", kind, old=old)
        assert reason is not None and "only in a namespace that is terminating" in reason
        assert await why("delete", kind, old=old, ns="gone-soon") is None
        assert await why("delete", kind, old=old, ns="never-was") is None  # the orphan sweep
    assert await why("delete", ENDPOINTS, old=endpoints("web", managed=True)) is None
    assert await why("delete", ENDPOINTS, old=endpoints("ext")) is not None
    assert await why("delete", ENDPOINT_SLICE, old=endpoint_slice("web", MIRROR)) is None
    assert await why("delete", ENDPOINT_SLICE, old=endpoint_slice("web", "someone")) is not None


async def test_reads_and_cluster_objects_are_left_to_the_rules() -> None:
    assert await why("get", POD, old={"metadata": {"name": "p"}}) is None
    subnet = {"metadata": {"name": "n1"}}
    assert await why("delete", HOST_SUBNET, old=subnet) is None
    assert await why("create", NAMESPACE, new={"metadata": {"name": "x"}}) is None
