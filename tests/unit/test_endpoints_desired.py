"""The desired Endpoints and EndpointSlices of a Service (pure functions), against
Kubernetes' rules; the results also pass the API's own validation."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.controllers.endpointsdesired import (
    ENDPOINTS_CONTROLLER,
    ENDPOINTS_MANAGED_BY,
    HEADLESS_LABEL,
    MAX_ENDPOINTS_ADDRESSES,
    OVER_CAPACITY,
    desired_endpoints,
    endpoints_differ,
    manages,
    target_port,
)
from podnet.controllers.endpointslicesdesired import (
    MAX_ENDPOINTS_PER_SLICE,
    MIRROR_CONTROLLER,
    SLICE_CONTROLLER,
    desired_slices,
    slice_differs,
)
from podnet.controllers.endpointsmirror import SKIP_MIRROR_LABEL, mirrored_slices, mirrors
from podnet.controllers.endpointspods import PodShrinker
from podnet.model.kinds import ENDPOINT_SLICE, ENDPOINTS
from podnet.model.schemas_discovery import MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from podnet.model.validation import validate

Obj = dict[str, Any]


def service(
    name: str = "web",
    selector: dict[str, str] | None = None,
    ports: list[Obj] | None = None,
    **spec: Any,
) -> Obj:
    body: Obj = {"selector": {"app": "web"} if selector is None else selector}
    body["ports"] = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
    if ports is not None:
        body["ports"] = ports
    body.update(spec)
    meta = {"name": name, "namespace": "ns", "uid": "svc-uid", "labels": {"tier": "front"}}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": body}


def pod(
    name: str,
    ip: str | None,
    ready: bool = True,
    labels: dict[str, str] | None = None,
    ports: list[Obj] | None = None,
    namespace: str = "ns",
    **extra: Any,
) -> Obj:
    status: Obj = {"phase": "Running"}
    if ip:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    meta: Obj = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    meta["labels"] = {"app": "web"} if labels is None else labels
    spec: Obj = {"nodeName": "node-1", "containers": [{"name": "main", "ports": ports or []}]}
    obj: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    obj["status"] = status
    for key, value in extra.items():
        section, _, field = key.partition("__")
        obj[section][field] = value
    return obj


def addresses(subset: Obj, field: str = "addresses") -> list[str]:
    return [a["ip"] for a in subset.get(field) or []]


def test_ready_and_not_ready_pods_split_and_objects_validate() -> None:
    svc = service()
    pods = [pod("a", "10.1.0.5"), pod("b", "10.1.0.6", ready=False), pod("c", None)]
    pods.append(pod("d", "10.1.0.7", labels={"app": "other"}))
    pods.append(pod("e", "10.1.0.8", namespace="elsewhere"))
    ep = desired_endpoints(svc, pods)
    assert [addresses(s) for s in ep["subsets"]] == [["10.1.0.5"]]
    assert [addresses(s, "notReadyAddresses") for s in ep["subsets"]] == [["10.1.0.6"]]
    assert ep["subsets"][0]["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    first = ep["subsets"][0]["addresses"][0]
    assert first["nodeName"] == "node-1"
    assert first["targetRef"] == {"kind": "Pod", "namespace": "ns", "name": "a", "uid": "uid-a"}
    labels = ep["metadata"]["labels"]
    assert labels == {"tier": "front", ENDPOINTS_MANAGED_BY: ENDPOINTS_CONTROLLER}
    assert validate(ENDPOINTS, ep)["subsets"] == ep["subsets"]

    slices = list(desired_slices(svc, pods).values())
    assert len(slices) == 1
    (one,) = slices
    assert one["addressType"] == "IPv4"
    assert one["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    conditions = {e["addresses"][0]: e["conditions"] for e in one["endpoints"]}
    assert conditions == {
        "10.1.0.5": {"ready": True, "serving": True, "terminating": False},
        "10.1.0.6": {"ready": False, "serving": False, "terminating": False},
    }
    assert one["metadata"]["labels"][SERVICE_NAME_LABEL] == "web"
    assert one["metadata"]["labels"][MANAGED_BY_LABEL] == SLICE_CONTROLLER
    owner = one["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Service", "web", "svc-uid")
    assert validate(ENDPOINT_SLICE, one)["endpoints"] == one["endpoints"]


def test_publish_not_ready_addresses_puts_every_pod_in_ready() -> None:
    svc = service(publishNotReadyAddresses=True)
    pods = [pod("a", "10.1.0.5"), pod("b", "10.1.0.6", ready=False)]
    (subset,) = desired_endpoints(svc, pods)["subsets"]
    assert addresses(subset) == ["10.1.0.5", "10.1.0.6"] and "notReadyAddresses" not in subset
    (one,) = desired_slices(svc, pods).values()
    assert all(e["conditions"]["ready"] for e in one["endpoints"])
    serving = {e["addresses"][0]: e["conditions"]["serving"] for e in one["endpoints"]}
    assert serving == {"10.1.0.5": True, "10.1.0.6": False}


def test_named_target_port_resolves_per_pod_into_separate_subsets_and_slices() -> None:
    svc = service(ports=[{"name": "http", "port": 80, "targetPort": "web", "protocol": "TCP"}])
    pods = [
        pod("a", "10.1.0.5", ports=[{"name": "web", "containerPort": 8080, "protocol": "TCP"}]),
        pod("b", "10.1.0.6", ports=[{"name": "web", "containerPort": 9090, "protocol": "TCP"}]),
        pod("c", "10.1.0.7", ports=[{"name": "web", "containerPort": 9090, "protocol": "UDP"}]),
        pod("d", "10.1.0.8", ports=[{"name": "other", "containerPort": 8080}]),
    ]
    subsets = desired_endpoints(svc, pods)["subsets"]
    by_port = {s["ports"][0]["port"]: addresses(s) for s in subsets}
    assert by_port == {8080: ["10.1.0.5"], 9090: ["10.1.0.6"]}
    slices = desired_slices(svc, pods)
    by_port = {s["ports"][0]["port"]: s for s in slices.values() if s["ports"]}
    assert sorted(by_port) == [8080, 9090]
    assert [e["addresses"] for e in by_port[9090]["endpoints"]] == [["10.1.0.6"]]
    # kube's slices keep a pod without the port, in a slice without ports
    portless = [s for s in slices.values() if not s["ports"]]
    assert [e["addresses"] for s in portless for e in s["endpoints"]] == [
        ["10.1.0.7"],
        ["10.1.0.8"],
    ]


def test_target_port_by_number_and_by_missing_name() -> None:
    number = {"port": 80, "targetPort": 8443, "protocol": "TCP"}
    assert target_port(pod("a", "10.1.0.5"), number) == 8443
    assert target_port(pod("a", "10.1.0.5"), {"port": 80, "targetPort": "nope"}) is None


def test_hostname_for_pods_whose_subdomain_is_the_service() -> None:
    svc = service(name="db", clusterIP="None")
    pods = [
        pod("a", "10.1.0.5", spec__hostname="db-0", spec__subdomain="db"),
        pod("b", "10.1.0.6", spec__hostname="db-1", spec__subdomain="other"),
    ]
    ep = desired_endpoints(svc, pods)
    hostnames = {a["ip"]: a.get("hostname") for a in ep["subsets"][0]["addresses"]}
    assert hostnames == {"10.1.0.5": "db-0", "10.1.0.6": None}
    assert ep["metadata"]["labels"][HEADLESS_LABEL] == ""
    (one,) = desired_slices(svc, pods).values()
    assert {e["addresses"][0]: e.get("hostname") for e in one["endpoints"]} == hostnames


def test_headless_service_without_ports_lists_its_pods() -> None:
    svc = service(clusterIP="None", ports=[])
    (subset,) = desired_endpoints(svc, [pod("a", "10.1.0.5")])["subsets"]
    assert addresses(subset) == ["10.1.0.5"] and "ports" not in subset
    # not headless and no ports: nothing in v1 Endpoints
    assert "subsets" not in desired_endpoints(service(ports=[]), [pod("a", "10.1.0.5")])


def test_terminating_and_finished_pods() -> None:
    svc = service()
    gone = pod("a", "10.1.0.5", metadata__deletionTimestamp="2026-01-01T00:00:00Z")
    done = pod("b", "10.1.0.6", status__phase="Succeeded", spec__restartPolicy="Never")
    retry = pod("c", "10.1.0.7", status__phase="Failed", spec__restartPolicy="OnFailure")
    assert [addresses(s) for s in desired_endpoints(svc, [gone, done, retry])["subsets"]] == [
        ["10.1.0.7"]
    ]
    (one,) = desired_slices(svc, [gone, done]).values()
    (endpoint,) = one["endpoints"]
    assert endpoint["conditions"] == {"ready": False, "serving": True, "terminating": True}


def test_dual_stack_pods() -> None:
    """Slices per family of the Service; v1 Endpoints with the primary family's IP."""
    svc = service(ipFamilies=["IPv6", "IPv4"])
    dual = pod("a", "10.1.0.5")
    dual["status"]["podIPs"] = [{"ip": "10.1.0.5"}, {"ip": "fd00::5"}]
    (subset,) = desired_endpoints(svc, [dual])["subsets"]
    assert addresses(subset) == ["fd00::5"]
    slices = {s["addressType"]: s for s in desired_slices(svc, [dual]).values()}
    assert {t: [e["addresses"] for e in s["endpoints"]] for t, s in slices.items()} == {
        "IPv4": [["10.1.0.5"]],
        "IPv6": [["fd00::5"]],
    }
    (only,) = desired_slices(service(), [dual]).values()
    assert only["addressType"] == "IPv4" and only["endpoints"][0]["addresses"] == ["10.1.0.5"]


def test_which_services_are_managed() -> None:
    assert manages(service())
    assert not manages(service(selector={}))
    assert not manages(service(type="ExternalName", externalName="example.com"))


def test_no_pods_gives_a_placeholder_slice() -> None:
    (one,) = desired_slices(service(), []).values()
    assert one["endpoints"] == [] and one["ports"] == [] and one["addressType"] == "IPv4"
    validate(ENDPOINT_SLICE, one)


def test_large_services_are_chunked_and_endpoints_capped() -> None:
    count = MAX_ENDPOINTS_ADDRESSES + 50
    pods = [pod(f"p{i}", f"10.1.{i // 250}.{i % 250 + 1}", ready=i % 2 == 0) for i in range(count)]
    ep = desired_endpoints(service(), pods)
    kept = sum(len(addresses(s)) + len(addresses(s, "notReadyAddresses")) for s in ep["subsets"])
    assert kept == MAX_ENDPOINTS_ADDRESSES
    assert sum(len(addresses(s)) for s in ep["subsets"]) == (count + 1) // 2  # ready first
    assert ep["metadata"]["annotations"] == {OVER_CAPACITY: "truncated"}
    slices = desired_slices(service(), pods)
    assert all(len(s["endpoints"]) <= MAX_ENDPOINTS_PER_SLICE for s in slices.values())
    assert sum(len(s["endpoints"]) for s in slices.values()) == count
    assert len(slices) == -(-count // MAX_ENDPOINTS_PER_SLICE)


def test_differ_sees_only_owned_fields() -> None:
    svc = service()
    pods = [pod("a", "10.1.0.5")]
    ep = desired_endpoints(svc, pods)
    stored = {**ep, "metadata": {**ep["metadata"], "resourceVersion": "7", "uid": "x"}}
    assert not endpoints_differ(stored, ep)
    assert endpoints_differ({**stored, "subsets": []}, ep)
    (one,) = desired_slices(svc, pods).values()
    stored_slice = {**one, "metadata": {**one["metadata"], "resourceVersion": "9"}}
    assert not slice_differs(stored_slice, one)
    assert slice_differs({**stored_slice, "endpoints": []}, one)


def test_names_are_stable_and_differ_by_ports() -> None:
    svc = service()
    first = desired_slices(svc, [pod("a", "10.1.0.5")])
    assert list(first) == list(desired_slices(svc, [pod("a", "10.1.0.5"), pod("b", "10.1.0.6")]))
    other = service(ports=[{"name": "http", "port": 80, "targetPort": 9000, "protocol": "TCP"}])
    assert set(first).isdisjoint(desired_slices(other, [pod("a", "10.1.0.5")]))
    assert all(name.startswith("web-") for name in first)


def test_hand_written_endpoints_are_mirrored_into_slices() -> None:
    manual: Obj = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": "db", "namespace": "ns", "uid": "ep-uid", "labels": {"x": "y"}},
        "subsets": [
            {
                "addresses": [{"ip": "192.0.2.10", "hostname": "db-0"}, {"ip": "2001:db8::1"}],
                "notReadyAddresses": [{"ip": "192.0.2.11", "nodeName": "n1"}],
                "ports": [{"name": "pg", "port": 5432}],
            }
        ],
    }
    selectorless = service("db", selector={})
    assert mirrors(selectorless, manual)
    assert not mirrors(service("db"), manual)
    assert not mirrors(service("db", selector={}, type="ExternalName"), manual)
    skipped = {**manual, "metadata": {**manual["metadata"], "labels": {SKIP_MIRROR_LABEL: "true"}}}
    assert not mirrors(selectorless, skipped)
    ours = desired_endpoints(service("db"), [])
    assert not mirrors(selectorless, ours)

    slices = {s["addressType"]: s for s in mirrored_slices(manual).values()}
    assert sorted(slices) == ["IPv4", "IPv6"]
    v4 = slices["IPv4"]
    assert v4["endpoints"] == [
        {"addresses": ["192.0.2.10"], "conditions": {"ready": True}, "hostname": "db-0"},
        {"addresses": ["192.0.2.11"], "conditions": {"ready": False}, "nodeName": "n1"},
    ]
    assert v4["ports"] == [{"name": "pg", "port": 5432, "protocol": "TCP"}]
    labels = v4["metadata"]["labels"]
    assert labels == {"x": "y", SERVICE_NAME_LABEL: "db", MANAGED_BY_LABEL: MIRROR_CONTROLLER}
    owner = v4["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Endpoints", "db", "ep-uid")
    for one in slices.values():
        validate(ENDPOINT_SLICE, one)
    assert mirrored_slices({**manual, "subsets": []}) == {}
    # the mirror and the controller never pick the same names
    assert set(mirrored_slices(manual)).isdisjoint(desired_slices(service("db"), []))


def test_slim_pods_give_the_same_endpoints() -> None:
    svc = service(ports=[{"name": "http", "port": 80, "targetPort": "web", "protocol": "TCP"}])
    web = [{"name": "web", "containerPort": 8080, "protocol": "TCP"}]
    pods = [pod("a", "10.1.0.5", ports=web), pod("b", "10.1.0.6", ready=False, ports=web)]
    pods.append(pod("c", "10.1.0.7", ports=web, spec__hostname="c", spec__subdomain="web"))
    pods[0]["status"]["conditions"].append({"type": "PodScheduled", "status": "True"})
    pods[0]["metadata"]["annotations"] = {"big": "x" * 1000}
    shrink = PodShrinker()
    slim = [shrink(p) for p in pods]
    assert desired_endpoints(svc, slim) == desired_endpoints(svc, pods)
    assert desired_slices(svc, slim) == desired_slices(svc, pods)
    assert "annotations" not in slim[0]["metadata"]
    assert slim[0]["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    # what pods hold alike is one object
    assert slim[0]["status"]["conditions"] is slim[2]["status"]["conditions"]
    assert slim[0]["metadata"]["labels"] is slim[1]["metadata"]["labels"]
    assert slim[0]["spec"]["containers"] is slim[1]["spec"]["containers"]


pod_specs = st.lists(
    st.tuples(st.booleans(), st.booleans(), st.sampled_from([None, 8080, 9090])),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(specs=pod_specs, publish=st.booleans())
def test_every_counted_pod_with_the_port_appears_exactly_once(
    specs: list[tuple[bool, bool, int | None]], publish: bool
) -> None:
    """Each matching pod with an IP and the named port: once in Endpoints (ready side as its
    readiness says) and once in the slices; pods lacking the port: not in Endpoints."""
    svc = service(ports=[{"name": "http", "port": 80, "targetPort": "web", "protocol": "TCP"}])
    svc["spec"]["publishNotReadyAddresses"] = publish
    pods = []
    for i, (ready, selected, number) in enumerate(specs):
        ports = [{"name": "web", "containerPort": number, "protocol": "TCP"}] if number else []
        labels = {"app": "web" if selected else "db"}
        pods.append(pod(f"p{i}", f"10.1.0.{i + 1}", ready=ready, labels=labels, ports=ports))
    ep = desired_endpoints(svc, pods)
    ready_ips = [ip for s in ep.get("subsets", []) for ip in addresses(s)]
    waiting = [ip for s in ep.get("subsets", []) for ip in addresses(s, "notReadyAddresses")]
    expected_ready = [
        f"10.1.0.{i + 1}" for i, (r, sel, n) in enumerate(specs) if sel and n and (r or publish)
    ]
    expected_waiting = [
        f"10.1.0.{i + 1}" for i, (r, sel, n) in enumerate(specs) if sel and n and not (r or publish)
    ]
    assert sorted(ready_ips) == sorted(expected_ready)
    assert sorted(waiting) == sorted(expected_waiting)
    for subset in ep.get("subsets", []):
        port = subset["ports"][0]["port"]
        for ip in addresses(subset) + addresses(subset, "notReadyAddresses"):
            assert specs[int(ip.rsplit(".", 1)[1]) - 1][2] == port
    in_slices = [
        e["addresses"][0] for s in desired_slices(svc, pods).values() for e in s["endpoints"]
    ]
    assert sorted(in_slices) == sorted(
        f"10.1.0.{i + 1}" for i, (_r, sel, _n) in enumerate(specs) if sel
    )
