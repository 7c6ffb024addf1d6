"""The outside world's view of the router in a local cluster: real clients (curl,
``openssl s_client``, a small Python load loop) run in the external host's namespace
with ``ip netns exec``, so route hosts resolve through the apps domain's resolver, and
the cluster's objects the router tests make (backend pods, Services, Routes).
"""

from __future__ import annotations

import csv
import io
import json
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from podnet.api.pki import issue_leaf, key_pem
from podnet.cluster import pods
from podnet.cluster.router import router_paths
from podnet.cluster.state import ClusterState
from podnet.cluster.underlay import external_netns
from podnet.testing.routecerts import RouteCa

HTTPECHO = (sys.executable, "-m", "podnet.cluster.httpecho")
RUN_DIR = "haproxy"  # the router's --run-dir in its volume (podnet.cluster.router)
TIMEOUT = 30.0


def in_external(state: ClusterState, argv: Sequence[str], timeout: float = TIMEOUT) -> Any:
    """Run ``argv`` on the external host (its resolv.conf bound in by ``ip netns exec``)."""
    command = ["ip", "netns", "exec", external_netns(state), *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class Answer:
    """One HTTP exchange as curl saw it: the status, the serving pod (from the httpecho
    body; "" for another body), the Location header and the body."""

    code: int
    pod: str
    location: str
    body: str

    @property
    def echoed(self) -> dict[str, Any]:
        """The httpecho body as JSON ({} for another body)."""
        try:
            value = json.loads(self.body)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def curl(state: ClusterState, url: str, *options: str, cacert: Path | None = None) -> Answer:
    """GET ``url`` from the external host with curl (``options`` added)."""
    argv = ["curl", "-sS", "-m", "10", "-o", "-", "-w", "\n%{http_code} %{redirect_url}"]
    argv += ["--cacert", str(cacert)] if cacert is not None else []
    done = in_external(state, [*argv, *options, url])
    if done.returncode != 0:
        return Answer(0, "", "", done.stderr.strip())
    body, _, tail = done.stdout.rpartition("\n")
    code, _, location = tail.partition(" ")
    answer = Answer(int(code), "", location.strip(), body)
    return Answer(answer.code, str(answer.echoed.get("pod", "")), answer.location, body)


@dataclass(frozen=True)
class PeerCertificate:
    """What ``openssl s_client`` saw: the subject and issuer lines of the leaf."""

    subject: str
    issuer: str


def peer_certificate(state: ClusterState, address: str, servername: str) -> PeerCertificate:
    """The certificate the router's port 443 (or what it passes through) shows for SNI
    ``servername``."""
    argv = ["openssl", "s_client", "-connect", f"{address}:443", "-servername", servername]
    shown = subprocess.run(
        ["ip", "netns", "exec", external_netns(state), *argv],
        input="",
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    subject = issuer = ""
    for line in shown.stdout.splitlines():
        if line.startswith("subject="):
            subject = line.removeprefix("subject=").strip()
        elif line.startswith("issuer="):
            issuer = line.removeprefix("issuer=").strip()
    if not subject:
        raise AssertionError(f"openssl s_client showed no certificate: {shown.stderr[-400:]}")
    return PeerCertificate(subject, issuer)


SHARES = """\
import http.client, json, sys
counts = {}
for _ in range(int(sys.argv[2])):
    c = http.client.HTTPConnection(sys.argv[1], 80, timeout=10)
    c.request("GET", "/")
    r = c.getresponse()
    body = r.read()
    pod = json.loads(body).get("pod", "") if r.status == 200 else str(r.status)
    counts[pod] = counts.get(pod, 0) + 1
    c.close()
print(json.dumps(counts))
"""


def shares(state: ClusterState, host: str, count: int) -> Counter[str]:
    """How many of ``count`` requests (a new connection each, no cookie) each pod
    served for ``host``."""
    done = in_external(state, [sys.executable, "-c", SHARES, host, str(count)], timeout=120)
    assert done.returncode == 0, done.stderr
    return Counter(json.loads(done.stdout))


TLS_MOUNT = Path("/mnt")  # where a TLS backend pod sees its certificate and key


def backend_pod(
    state_dir: Path,
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    node: str | None = None,
    tls: tuple[Path, Path] | None = None,
) -> pods.PodRecord:
    """An httpecho pod serving HTTP on 8080 (and HTTPS on 8443 with ``tls``: the
    certificate and key files, in one directory, which the pod sees at ``TLS_MOUNT``, as
    it sees none of the host's /tmp; read as root: such a pod is privileged)."""
    command = [*HTTPECHO, "--name", name, "--port", "8080"]
    ports: list[pods.ContainerPort] = [("http", 8080, "TCP")]
    volumes: list[tuple[Path, Path]] = []
    if tls is not None:
        assert tls[0].parent == tls[1].parent, "one directory for both files"
        volumes.append((tls[0].parent, TLS_MOUNT))
        cert, key = (str(TLS_MOUNT / path.name) for path in tls)
        command += ["--tls-port", "8443", "--cert", cert, "--key", key]
        ports.append(("https", 8443, "TCP"))
    privileged = tls is not None
    pod = pods.run_pod(
        state_dir, name, namespace, node, labels, tuple(command), ports, privileged, volumes=volumes
    )
    for _, port, _ in ports:
        pods.wait_listening(pod, port)
    return pod


def service(name: str, selector: Mapping[str, str], tls: bool = False) -> dict[str, Any]:
    """A Service for httpecho pods: port 80 (named http) to 8080, and 443 (https) to 8443."""
    ports = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
    if tls:
        ports.append({"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": dict(selector), "ports": ports},
    }


def route(
    name: str,
    host: str,
    to: str,
    path: str = "",
    tls: Mapping[str, Any] | None = None,
    port: str | None = None,
    alternates: Sequence[tuple[str, int]] = (),
    weight: int | None = None,
) -> dict[str, Any]:
    """A Route object (route.openshift.io/v1)."""
    target: dict[str, Any] = {"kind": "Service", "name": to}
    if weight is not None:
        target["weight"] = weight
    spec: dict[str, Any] = {"host": host, "to": target}
    if path:
        spec["path"] = path
    if tls is not None:
        spec["tls"] = dict(tls)
    if port is not None:
        spec["port"] = {"targetPort": port}
    if alternates:
        spec["alternateBackends"] = [
            {"kind": "Service", "name": alt, "weight": w} for alt, w in alternates
        ]
    return {
        "apiVersion": "route.openshift.io/v1",
        "kind": "Route",
        "metadata": {"name": name},
        "spec": spec,
    }


def echo_routes(service: str, http_host: str, edge_host: str) -> list[dict[str, Any]]:
    """An http Route (``web``) and an edge Route (``edge``: TLS ends at the router) to the
    plain-HTTP port (``http``) of an httpecho ``service``.

    The port is named as ``oc expose service`` names it: a Route without one is served
    by every port of the Service's endpoints (OpenShift's router does the same), so over a
    Service with the pods' HTTPS port too, every other plain request would go to the TLS
    port, fail, and cost the client its kept-alive connection.
    """
    return [
        route("web", http_host, service, port="http"),
        route("edge", edge_host, service, tls={"termination": "edge"}, port="http"),
    ]


def frontend_sessions(state_dir: Path) -> dict[str, int]:
    """The connections each frontend of the cluster router's HAProxy has accepted (its
    ``stot`` in ``show stat``, read over the current worker's runtime API), by name."""
    sock = router_paths(state_dir).volume / RUN_DIR / "haproxy.sock"
    with socket.socket(socket.AF_UNIX) as cli:
        cli.settimeout(TIMEOUT)
        cli.connect(str(sock))
        cli.sendall(b"show stat\n")
        text = b"".join(iter(lambda: cli.recv(65536), b"")).decode()
    header, _, body = text.lstrip("# ").partition("\n")
    rows = csv.DictReader(io.StringIO(body), fieldnames=header.rstrip(",").split(","))
    return {r["pxname"]: int(r["stot"]) for r in rows if r.get("svname") == "FRONTEND"}


def admitted(route_obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """The Admitted condition's (status, reason) in the route's status, or None."""
    for ingress in (route_obj.get("status") or {}).get("ingress") or []:
        for condition in ingress.get("conditions") or []:
            if condition.get("type") == "Admitted":
                return str(condition.get("status")), str(condition.get("reason") or "")
    return None


def issue_files(ca: RouteCa, names: Sequence[str], directory: Path, stem: str) -> tuple[Path, Path]:
    """A serving certificate for ``names`` (the first is its CN) signed by ``ca``, and
    its key, written to ``directory`` as ``<stem>.crt`` and ``<stem>.key``."""
    sans: set[x509.IPAddress | x509.DNSName] = {x509.DNSName(name) for name in names}
    cert, key = issue_leaf(
        ca.certificate, ca.key, names[0], sans, [ExtendedKeyUsageOID.SERVER_AUTH]
    )
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key_pem(key))
    key_path.chmod(0o600)
    return cert_path, key_path
