"""The service environment variables of a pod (pure): names, values and which Services."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from podnet.cluster.podenv import (
    load_environment,
    namespace_service_environment,
    save_environment,
    service_environment,
    service_variables,
    visible_services,
)


def svc(name: str, ip: str | None, *ports: dict[str, Any], ns: str = "shop") -> dict[str, Any]:
    spec: dict[str, Any] = {"ports": list(ports)}
    if ip is not None:
        spec["clusterIP"] = ip
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}


def test_variables_of_a_two_port_service_as_kubernetes_sets_them() -> None:
    web = svc(
        "web-front",
        "10.0.0.10",
        {"name": "http", "port": 80, "protocol": "TCP"},
        {"name": "dns-udp", "port": 53, "protocol": "UDP"},
    )
    assert service_variables(web) == {
        "WEB_FRONT_SERVICE_HOST": "10.0.0.10",
        "WEB_FRONT_SERVICE_PORT": "80",
        "WEB_FRONT_SERVICE_PORT_HTTP": "80",
        "WEB_FRONT_SERVICE_PORT_DNS_UDP": "53",
        "WEB_FRONT_PORT": "tcp://10.0.0.10:80",
        "WEB_FRONT_PORT_80_TCP": "tcp://10.0.0.10:80",
        "WEB_FRONT_PORT_80_TCP_PROTO": "tcp",
        "WEB_FRONT_PORT_80_TCP_PORT": "80",
        "WEB_FRONT_PORT_80_TCP_ADDR": "10.0.0.10",
        "WEB_FRONT_PORT_53_UDP": "udp://10.0.0.10:53",
        "WEB_FRONT_PORT_53_UDP_PROTO": "udp",
        "WEB_FRONT_PORT_53_UDP_PORT": "53",
        "WEB_FRONT_PORT_53_UDP_ADDR": "10.0.0.10",
    }


def test_unnamed_port_default_protocol_and_ipv6() -> None:
    one = service_variables(svc("db", "fd00::a", {"port": 5432}))
    assert one["DB_PORT"] == "tcp://[fd00::a]:5432"
    assert one["DB_PORT_5432_TCP_ADDR"] == "fd00::a"
    assert not any(k.startswith("DB_SERVICE_PORT_") for k in one)


def test_services_without_a_cluster_ip_or_ports_give_nothing() -> None:
    assert service_variables(svc("headless", "None", {"port": 80})) == {}
    assert service_variables(svc("pending", None, {"port": 80})) == {}
    assert service_variables(svc("bad", "not-an-ip", {"port": 80})) == {}
    external = {"metadata": {"name": "ext"}, "spec": {"type": "ExternalName"}}
    assert service_variables(external) == {}
    assert service_variables(svc("noports", "10.0.0.9")) == {}


def test_visible_services_own_namespace_and_the_master_service() -> None:
    own = [svc("web", "10.0.0.10", {"port": 80}), svc("api", "10.0.0.11", {"port": 81})]
    master = [
        svc("kubernetes", "10.0.0.1", {"name": "https", "port": 443}, ns="default"),
        svc("other", "10.0.0.2", {"port": 1}, ns="default"),
    ]
    names = [s["metadata"]["name"] for s in visible_services("shop", own, master)]
    assert names == ["api", "kubernetes", "web"], "default's other services stay out"
    shadow = [svc("kubernetes", "10.0.0.99", {"port": 443})]
    env = service_environment(visible_services("shop", shadow, master))
    assert env["KUBERNETES_SERVICE_HOST"] == "10.0.0.99", "the pod's namespace wins"
    in_default = visible_services("default", master, master)
    assert [s["metadata"]["name"] for s in in_default] == ["kubernetes", "other"]


class FakeApi:
    def __init__(self, by_ns: dict[str, list[dict[str, Any]]]) -> None:
        self.by_ns = by_ns
        self.asked: list[str] = []

    def list(self, kind: Any, namespace: str) -> dict[str, Any]:
        self.asked.append(namespace)
        return {"items": self.by_ns.get(namespace, [])}


def test_namespace_service_environment_reads_the_namespace_and_default() -> None:
    api = FakeApi(
        {
            "shop": [svc("web", "10.0.0.10", {"port": 80})],
            "default": [svc("kubernetes", "10.0.0.1", {"port": 443}, ns="default")],
        }
    )
    env = namespace_service_environment(api, "shop")
    assert env["WEB_SERVICE_HOST"] == "10.0.0.10"
    assert env["KUBERNETES_SERVICE_PORT"] == "443"
    assert api.asked == ["shop", "default"]
    api.asked.clear()
    assert "WEB_SERVICE_HOST" not in namespace_service_environment(api, "default")
    assert api.asked == ["default"]


def test_kept_variables_round_trip_and_only_service_names_come_back(tmp_path: Path) -> None:
    path = tmp_path / "pods" / "shop_web.env.json"
    env = service_variables(svc("web", "10.0.0.10", {"name": "http", "port": 80}))
    save_environment(path, env)
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_environment(path) == env
    path.write_text(json.dumps({**env, "LD_PRELOAD": "/tmp/x.so", "PATH": "/tmp", "A_PORT": 1}))
    assert load_environment(path) == env, "no other names, no non-strings"
    path.write_text("[1, 2]")
    assert load_environment(path) == {}
    path.write_text("{not json")
    assert load_environment(path) == {}
    assert load_environment(tmp_path / "missing") == {}
