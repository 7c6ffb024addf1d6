"""The real kubectl (1.32) making and changing Services on a real master: create
service, expose, apply/replace/patch, and the table columns (podnet get shows the same)."""

from __future__ import annotations

import ipaddress
import json

import pytest
import yaml

from podnet.testing.cli import run_kubectl, run_podnet
from podnet.testing.processes import MasterProcess

pytestmark = pytest.mark.usefixtures("kubectl")

SERVICE_NETWORK = ipaddress.ip_network("172.30.0.0/16")


def ok(master: MasterProcess, *args: str, stdin: str | None = None) -> str:
    result = run_kubectl(master.kubeconfig, *args, stdin=stdin)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def fails(master: MasterProcess, *args: str, stdin: str | None = None) -> str:
    result = run_kubectl(master.kubeconfig, *args, stdin=stdin)
    assert result.returncode != 0, f"kubectl {' '.join(args)} succeeded: {result.stdout}"
    return result.stderr


def spec(master: MasterProcess, name: str) -> dict[str, object]:
    out: dict[str, object] = json.loads(ok(master, "get", "svc", name, "-o", "json"))["spec"]
    return out


def test_kubectl_create_service_kinds_and_columns(master: MasterProcess) -> None:
    ok(master, "create", "service", "clusterip", "web", "--tcp=80:8080")
    ok(master, "create", "service", "nodeport", "np", "--tcp=80:8080", "--node-port=30080")
    ok(master, "create", "service", "clusterip", "headless", "--clusterip=None", "--tcp=80")
    ok(master, "create", "service", "externalname", "db", "--external-name=db.example.com")
    ok(master, "create", "service", "loadbalancer", "lb", "--tcp=443:8443")

    web = yaml.safe_load(ok(master, "get", "svc", "web", "-o", "yaml"))
    ip = web["spec"]["clusterIP"]
    assert ipaddress.ip_address(ip) in SERVICE_NETWORK
    assert {k: web["spec"][k] for k in ("clusterIPs", "ipFamilies", "ipFamilyPolicy")} == {
        "clusterIPs": [ip],
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
    }
    assert web["spec"]["sessionAffinity"] == "None"
    assert web["spec"]["internalTrafficPolicy"] == "Cluster"
    assert web["status"] == {"loadBalancer": {}}
    assert spec(master, "np")["ports"] == [
        {"name": "80-8080", "nodePort": 30080, "port": 80, "protocol": "TCP", "targetPort": 8080}
    ]
    assert spec(master, "headless")["clusterIP"] == "None"
    assert "clusterIP" not in spec(master, "db")

    rows = {line.split()[0]: line.split() for line in ok(master, "get", "svc").splitlines()}
    assert rows["NAME"] == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]
    assert rows["web"][1:5] == ["ClusterIP", ip, "<none>", "80/TCP"]
    assert rows["np"][1] == "NodePort" and rows["np"][4] == "80:30080/TCP"
    assert rows["headless"][2] == "None"
    assert rows["db"][1:5] == ["ExternalName", "<none>", "db.example.com", "<none>"]
    assert rows["lb"][3] == "<pending>" and rows["lb"][4].startswith("443:")
    wide = ok(master, "get", "svc", "web", "-o", "wide").splitlines()
    assert wide[0].split() == [
        "NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE", "SELECTOR"
    ]  # fmt: skip
    assert wide[1].split()[-1] == "app=web"

    ours = run_podnet(master.kubeconfig, "get", "svc", "-o", "wide")
    assert ours.returncode == 0, ours.stderr
    lines = {line.split()[0]: line.split() for line in ours.stdout.splitlines()}
    assert lines["NAME"] == rows["NAME"] + ["SELECTOR"]
    assert lines["np"][1:5] == [
        "NodePort",
        spec(master, "np")["clusterIP"],
        "<none>",
        "80:30080/TCP",
    ]

    # The same node port again is refused, with the field and the holder named.
    err = fails(master, "create", "service", "nodeport", "np2", "--tcp=81", "--node-port=30080")
    assert "spec.ports[0].nodePort" in err and "already used by default/np" in err
    err = fails(master, "create", "service", "nodeport", "np3", "--tcp=81", "--node-port=80")
    assert "30000-32767" in err
    assert "np2" not in ok(master, "get", "svc") and "np3" not in ok(master, "get", "svc")


def test_kubectl_expose_pod(master: MasterProcess) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "echo", "labels": {"app": "echo"}},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 8080}]}]
        },
    }
    ok(master, "create", "-f", "-", stdin=json.dumps(pod))
    ok(master, "expose", "pod", "echo", "--port=80", "--target-port=8080")
    exposed = spec(master, "echo")
    assert exposed["selector"] == {"app": "echo"}
    assert ipaddress.ip_address(str(exposed["clusterIP"])) in SERVICE_NETWORK
    ok(master, "expose", "pod", "echo", "--name=echo-np", "--port=80", "--type=NodePort")
    node_port = spec(master, "echo-np")["ports"]
    assert isinstance(node_port, list) and 30000 <= node_port[0]["nodePort"] <= 32767
    ok(
        master,
        "expose",
        "pod",
        "echo",
        "--name=echo-aff",
        "--port=80",
        "--session-affinity=ClientIP",
    )
    affinity = spec(master, "echo-aff")["sessionAffinityConfig"]
    assert affinity == {"clientIP": {"timeoutSeconds": 10800}}
    # This master allows no externalIPs (no --external-ip-cidrs): refused, flag named.
    args = ("expose", "pod", "echo", "--name=echo-ext", "--port=80", "--external-ip=192.0.2.50")
    err = fails(master, *args)
    assert "spec.externalIPs[0]" in err and "--external-ip-cidrs" in err


MANIFEST = """
apiVersion: v1
kind: Service
metadata: {{name: app}}
spec:
  type: {type}
  selector: {{app: app}}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
"""


def test_kubectl_apply_replace_and_patch_keep_or_release_values(master: MasterProcess) -> None:
    ok(master, "apply", "-f", "-", stdin=MANIFEST.format(type="NodePort"))
    first = spec(master, "app")
    ip, ports = first["clusterIP"], first["ports"]
    assert isinstance(ports, list)
    node_port = ports[0]["nodePort"]
    # Applied again, replaced: the manifest has no clusterIP or nodePort, both are kept.
    ok(master, "apply", "-f", "-", stdin=MANIFEST.format(type="NodePort"))
    ok(master, "replace", "-f", "-", stdin=MANIFEST.format(type="NodePort"))
    again = spec(master, "app")
    assert again["clusterIP"] == ip and again["ports"][0]["nodePort"] == node_port  # type: ignore[index]

    changed = MANIFEST.format(type="NodePort").replace("spec:", "spec:\n  clusterIP: 172.30.99.99")
    assert "field is immutable" in fails(master, "replace", "-f", "-", stdin=changed)
    assert "field is immutable" in fails(master, "apply", "-f", "-", stdin=changed)

    # NodePort -> ClusterIP releases the node port: another Service may take it now.
    ok(master, "apply", "-f", "-", stdin=MANIFEST.format(type="ClusterIP"))
    assert "nodePort" not in spec(master, "app")["ports"][0]  # type: ignore[index]
    ok(master, "create", "service", "nodeport", "taker", "--tcp=80", f"--node-port={node_port}")
    # ClusterIP -> ExternalName releases the IP; a Service may ask for it.
    patch = {"spec": {"type": "ExternalName", "externalName": "app.example.com"}}
    ok(master, "patch", "svc", "app", "-p", json.dumps(patch))
    assert "clusterIP" not in spec(master, "app")
    reuse = MANIFEST.format(type="ClusterIP").replace("name: app}", "name: reuse}")
    reuse = reuse.replace("spec:", f"spec:\n  clusterIP: {ip}")
    ok(master, "create", "-f", "-", stdin=reuse)
    assert spec(master, "reuse")["clusterIP"] == ip
    ok(master, "delete", "svc", "reuse", "taker", "app")
    left = ok(master, "get", "svc", "-o", "name").split()
    assert not {"service/reuse", "service/taker", "service/app"} & set(left)
