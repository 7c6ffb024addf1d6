"""The proxy's memory: the compiler keeps slim records (``service_record``,
``slice_record``), not the API objects, and the table it gives is the one a compile that
reads the whole objects gives; the heap is trimmed after large applies."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.services.compile import ServiceCompiler, service_record
from podnet.services.heap import trim_heap
from podnet.services.model import Endpoint, ServicePort, ServiceTable

Obj = dict[str, Any]
NODE = "node-1"


def reference_ports(service: Obj, slices: list[Obj]) -> list[ServicePort]:
    """What kube-proxy makes of one service, read straight from the full objects."""
    found = []
    for template in service_record(service):
        endpoints: dict[tuple[IPv4Address, int], Endpoint] = {}
        for piece in slices:
            if piece.get("addressType", "IPv4") != "IPv4":
                continue
            same = [
                p
                for p in piece.get("ports") or ()
                if str(p.get("name") or "") == template.port_name
                and str(p.get("protocol") or "TCP").lower() == template.protocol
            ]
            number = same[0].get("port") if same else None
            if not (type(number) is int and 0 < number < 65536):
                continue
            for entry in piece.get("endpoints") or ():
                if (entry.get("conditions") or {}).get("ready") is False:
                    continue
                try:
                    ip = IPv4Address((entry.get("addresses") or [""])[0])
                except ValueError:
                    continue
                new = Endpoint(ip, number, entry.get("nodeName") == NODE)
                old = endpoints.get((ip, number))
                endpoints[(ip, number)] = max(new, old) if old else new  # local wins
        found.append(
            ServicePort(**{**vars(template), "endpoints": tuple(sorted(endpoints.values()))})
        )
    return found


ENDPOINTS = st.lists(
    st.fixed_dictionaries(
        {
            "addresses": st.lists(
                st.sampled_from(["10.128.2.1", "10.128.2.2", "10.128.0.3", "fd00::1", "x"]),
                min_size=1,
                max_size=2,
            ),
            "nodeName": st.sampled_from([NODE, "node-2"]),
            "conditions": st.sampled_from([{}, {"ready": True}, {"ready": False}]),
        }
    ),
    max_size=4,
)
SLICE_PORTS = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["http", "dns", ""]),
            "protocol": st.sampled_from(["TCP", "UDP", "SCTP"]),
            "port": st.sampled_from([8080, 53, 0, 70000]),
        }
    ),
    max_size=3,
)
SLICES = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.sampled_from(["IPv4", "IPv4", "IPv6"]),
        ENDPOINTS,
        SLICE_PORTS,
    ),
    max_size=5,
)


def service(name: str) -> Obj:
    ports = [
        {"name": "http", "port": 80, "protocol": "TCP"},
        {"name": "dns", "port": 53, "protocol": "UDP"},
    ]
    spec = {"clusterIP": f"172.30.0.{ord(name)}", "type": "NodePort", "ports": ports}
    return {"metadata": {"namespace": "default", "name": name}, "spec": spec}


@given(SLICES)
@settings(max_examples=80, deadline=None)
def test_slim_records_give_the_table_the_whole_objects_give(raw: list[Any]) -> None:
    slices = [
        {
            "metadata": {
                "namespace": "default",
                "name": f"{owner}-{i}",
                "labels": {"kubernetes.io/service-name": owner},
            },
            "addressType": kind,
            "endpoints": endpoints,
            "ports": ports,
        }
        for i, (owner, kind, endpoints, ports) in enumerate(raw)
    ]
    services = [service("a"), service("b")]
    compiler = ServiceCompiler(NODE)
    compiler.replace_services(services)
    compiler.replace_slices(slices)
    want = [
        port
        for svc in services
        for port in reference_ports(
            svc,
            [
                s
                for s in slices
                if s["metadata"]["labels"]["kubernetes.io/service-name"] == svc["metadata"]["name"]
            ],
        )
    ]
    assert compiler.table() == ServiceTable(tuple(sorted(want, key=lambda p: p.key)))


def test_the_heap_is_trimmed_through_glibc() -> None:
    assert trim_heap()  # this project runs on glibc: malloc_trim is there and runs
