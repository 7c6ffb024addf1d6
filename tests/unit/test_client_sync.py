"""The CLI's ApiClient (podnet.client.sync): URLs, methods, bodies, errors, watch streams,
TLS trust and apply patches."""

from __future__ import annotations

import datetime as dt
import http.server
import ipaddress
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from podnet.client import (
    ClientConfigError,
    Expired,
    InvalidResponse,
    NotFound,
    ServerError,
    StatusError,
    TLSFailure,
    UnknownKind,
    Unreachable,
    is_transient,
    resource_path,
)
from podnet.client.apply import LAST_APPLIED, last_applied, three_way_patch, with_last_applied
from podnet.client.sync import ApiClient
from podnet.client.tls import ssl_context
from podnet.client.wire import MERGE_PATCH
from podnet.kubeconfig import ClientConfig
from podnet.model.kinds import HOST_SUBNET, NET_NAMESPACE, POD

SERVER = "https://api.test:6443"
Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A MockTransport handler that records requests and answers from a script."""

    def __init__(self, answer: Handler | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self.answer = answer or (lambda req: httpx.Response(200, json={"kind": "X"}))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return self.answer(request)

    def client(self, token: str | None = "tok") -> ApiClient:
        config = ClientConfig(server=SERVER, token=token)
        return ApiClient(config, transport=httpx.MockTransport(self))


def status(code: int, reason: str, message: str) -> httpx.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return httpx.Response(code, json=body)


# ---- paths ------------------------------------------------------------------------------


def test_resource_paths() -> None:
    assert resource_path(POD, "shop") == "/api/v1/namespaces/shop/pods"
    assert resource_path("po", "shop", "web") == "/api/v1/namespaces/shop/pods/web"
    assert resource_path(POD, None) == "/api/v1/pods"
    assert resource_path("hs") == "/apis/network.openshift.io/v1/hostsubnets"
    assert resource_path(HOST_SUBNET, "ignored", "n1") == (
        "/apis/network.openshift.io/v1/hostsubnets/n1"
    )
    assert resource_path("netpol", "a") == (
        "/apis/networking.k8s.io/v1/namespaces/a/networkpolicies"
    )
    with pytest.raises(ValueError, match="namespace is needed"):
        resource_path(POD, None, "web")
    with pytest.raises(UnknownKind, match='resource type "gadgets"'):
        resource_path("gadgets")


# ---- verbs ------------------------------------------------------------------------------


def test_get_sends_bearer_token_and_returns_the_object() -> None:
    rec = Recorder(lambda r: httpx.Response(200, json={"metadata": {"name": "n1"}}))
    obj = rec.client().get("hostsubnet", None, "n1")
    assert obj == {"metadata": {"name": "n1"}}
    req = rec.requests[0]
    assert (req.method, str(req.url)) == (
        "GET",
        f"{SERVER}/apis/network.openshift.io/v1/hostsubnets/n1",
    )
    assert req.headers["authorization"] == "Bearer tok"
    assert "authorization" not in rec.client(token=None)._http.headers


def test_list_passes_selectors_and_all_namespaces() -> None:
    rec = Recorder(lambda r: httpx.Response(200, json={"kind": "PodList", "items": []}))
    client = rec.client()
    client.list(POD, "shop", label_selector="app=web", field_selector="spec.nodeName=n1")
    client.list(POD, None)
    first, second = rec.requests
    assert first.url.path == "/api/v1/namespaces/shop/pods"
    assert dict(first.url.params) == {
        "labelSelector": "app=web",
        "fieldSelector": "spec.nodeName=n1",
    }
    assert second.url.path == "/api/v1/pods" and not second.url.params


def test_create_replace_patch_delete_methods_and_bodies() -> None:
    rec = Recorder()
    client = rec.client()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop"}}
    client.create(POD, pod)
    client.replace(POD, pod)
    client.patch(NET_NAMESPACE, None, "a", {"metadata": {"annotations": {"x": "y"}}})
    client.delete(HOST_SUBNET, None, "n1")
    seen = [(r.method, r.url.path) for r in rec.requests]
    assert seen == [
        ("POST", "/api/v1/namespaces/shop/pods"),
        ("PUT", "/api/v1/namespaces/shop/pods/web"),
        ("PATCH", "/apis/network.openshift.io/v1/netnamespaces/a"),
        ("DELETE", "/apis/network.openshift.io/v1/hostsubnets/n1"),
    ]
    assert json.loads(rec.requests[0].content) == pod
    assert rec.requests[0].headers["content-type"] == "application/json"
    assert rec.requests[2].headers["content-type"] == MERGE_PATCH
    assert json.loads(rec.requests[2].content) == {"metadata": {"annotations": {"x": "y"}}}
    with pytest.raises(ValueError, match="namespace is needed"):
        client.create(POD, {"metadata": {"name": "x"}})


# ---- errors -----------------------------------------------------------------------------


def test_status_body_becomes_api_client_error() -> None:
    rec = Recorder(lambda r: status(404, "NotFound", 'hostsubnets "n9" not found'))
    with pytest.raises(NotFound) as info:
        rec.client().get(HOST_SUBNET, None, "n9")
    err = info.value
    assert not is_transient(err)
    assert (err.code, err.reason, err.message) == (404, "NotFound", 'hostsubnets "n9" not found')
    assert str(err) == 'from server (NotFound): hostsubnets "n9" not found'


def test_error_without_status_body_uses_http_code() -> None:
    rec = Recorder(lambda r: httpx.Response(503, text="upstream\nbusy"))
    with pytest.raises(ServerError) as info:
        rec.client().list(HOST_SUBNET)
    assert is_transient(info.value)
    assert (info.value.code, info.value.reason, info.value.message) == (
        503,
        "ServiceUnavailable",
        "upstream busy",
    )


def test_non_json_success_is_an_error() -> None:
    rec = Recorder(lambda r: httpx.Response(200, text="<html>"))
    with pytest.raises(InvalidResponse, match="did not answer with JSON"):
        rec.client().get(HOST_SUBNET, None, "n1")


def test_transport_failure_is_unreachable_naming_the_server() -> None:
    def boom(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out\nwhile connecting", request=request)

    client = ApiClient(ClientConfig(server=SERVER), transport=httpx.MockTransport(boom))
    with pytest.raises(Unreachable) as info:
        client.get(HOST_SUBNET, None, "n1")
    assert is_transient(info.value)
    assert (
        str(info.value) == f"cannot reach the podnet master at {SERVER}: timed out while connecting"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_connection_refused_on_loopback_is_unreachable() -> None:
    server = f"http://127.0.0.1:{free_port()}"
    with ApiClient(ClientConfig(server=server)) as client, pytest.raises(Unreachable) as info:
        client.list(HOST_SUBNET)
    assert server in str(info.value)
    assert "\n" not in str(info.value)


# ---- watch ------------------------------------------------------------------------------


def event_lines(*events: dict) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def test_watch_streams_events_from_a_resource_version() -> None:
    events = [
        {"type": "ADDED", "object": {"metadata": {"name": "a"}}},
        {"type": "MODIFIED", "object": {"metadata": {"name": "a"}, "netid": 11}},
    ]
    rec = Recorder(lambda r: httpx.Response(200, content=event_lines(*events) + b"\n"))
    got = list(rec.client().watch(NET_NAMESPACE, since="42", label_selector="team=x"))
    assert [{"type": e.type, "object": e.object} for e in got] == events
    req = rec.requests[0]
    assert req.url.path == "/apis/network.openshift.io/v1/netnamespaces"
    assert dict(req.url.params) == {
        "watch": "true",
        "resourceVersion": "42",
        "labelSelector": "team=x",
    }


def test_watch_error_event_and_error_answer_raise() -> None:
    gone = {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "code": 410,
            "reason": "Expired",
            "message": "too old resource version: 1",
        },
    }
    rec = Recorder(lambda r: httpx.Response(200, content=event_lines(gone)))
    with pytest.raises(Expired) as info:
        list(rec.client().watch(HOST_SUBNET, since="1"))
    assert (info.value.code, info.value.reason) == (410, "Expired")
    rec = Recorder(lambda r: status(403, "Forbidden", "no watching"))
    with pytest.raises(StatusError, match="no watching"):
        list(rec.client().watch(HOST_SUBNET))


# ---- TLS --------------------------------------------------------------------------------


def _cert(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[str, object] | None, ca: bool
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        builder = builder.add_extension(san, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())  # type: ignore[arg-type]


def _pem(obj: x509.Certificate) -> bytes:
    return obj.public_bytes(serialization.Encoding.PEM)


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, bytes, list[str]]]:
    """An HTTPS server on loopback whose certificate is signed by a fresh CA."""
    ca_key, srv_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca_cert = _cert("test-ca", ca_key, None, ca=True)
    srv_cert = _cert("127.0.0.1", srv_key, ("test-ca", ca_key), ca=False)
    (tmp_path / "srv.pem").write_bytes(
        _pem(srv_cert)
        + srv_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            body = json.dumps({"kind": "HostSubnetList", "items": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "srv.pem")
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{httpd.server_address[1]}", _pem(ca_cert), seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def test_https_with_the_kubeconfig_ca(tls_server: tuple[str, bytes, list[str]]) -> None:
    url, ca_pem, seen = tls_server
    with ApiClient(ClientConfig(server=url, ca_data=ca_pem, token="abc")) as client:
        assert client.list(HOST_SUBNET)["kind"] == "HostSubnetList"
    assert seen == ["Bearer abc"]
    # Without the CA the server's certificate is not trusted: a TLS failure, one line.
    other_ca = _pem(_cert("other", ec.generate_private_key(ec.SECP256R1()), None, ca=True))
    with (
        ApiClient(ClientConfig(server=url, ca_data=other_ca)) as client,
        pytest.raises(TLSFailure, match="CERTIFICATE_VERIFY_FAILED") as info,
    ):
        client.list(HOST_SUBNET)
    assert not is_transient(info.value)
    assert "\n" not in str(info.value)


def test_ssl_context_choices() -> None:
    insecure = ssl_context(ClientConfig(server=SERVER, insecure_skip_tls_verify=True))
    assert (insecure.verify_mode, insecure.check_hostname) == (ssl.CERT_NONE, False)
    system = ssl_context(ClientConfig(server=SERVER))
    assert (system.verify_mode, system.check_hostname) == (ssl.CERT_REQUIRED, True)
    with pytest.raises(ClientConfigError, match="certificate authority"):
        ssl_context(ClientConfig(server=SERVER, ca_data=b"not a certificate"))


# ---- apply patches ----------------------------------------------------------------------


def test_with_last_applied_records_the_manifest_without_itself() -> None:
    obj = {"kind": "HostSubnet", "metadata": {"name": "n1"}, "subnet": "10.128.0.0/23"}
    annotated = with_last_applied(obj)
    recorded = json.loads(annotated["metadata"]["annotations"][LAST_APPLIED])
    assert recorded == obj
    assert last_applied(annotated) == obj
    assert with_last_applied(annotated) == annotated
    assert last_applied({"metadata": {}}) == {}


def test_three_way_patch() -> None:
    last = {"metadata": {"labels": {"a": "1", "b": "2"}}, "egressIPs": ["1.1.1.1"]}
    desired = {"metadata": {"labels": {"a": "1", "c": "3"}}, "hostIP": "10.0.0.2"}
    live = {
        "metadata": {"labels": {"a": "1", "b": "2", "server": "x"}, "uid": "u"},
        "egressIPs": ["1.1.1.1"],
        "hostIP": "10.0.0.1",
    }
    # Label b and egressIPs were applied before and are now dropped: removed. Label
    # "server" and the uid were never applied: left alone.
    assert three_way_patch(last, desired, live) == {
        "metadata": {"labels": {"c": "3", "b": None}},
        "hostIP": "10.0.0.2",
        "egressIPs": None,
    }
    assert three_way_patch(last, last, live) == {}
    assert three_way_patch({}, {"x": None}, {}) == {}
