"""The podnet CLI end to end against a fake Kubernetes-style API (httpx.MockTransport)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner, Result

from podnet.cli.adm import CHANGE_NETWORK
from podnet.cli.main import CliState, cli
from podnet.client.apply import LAST_APPLIED
from podnet.client.sync import ApiClient
from podnet.kubeconfig import ClientConfig, write_kubeconfig
from podnet.model.kinds import KINDS

SERVER = "https://api.test:6443"
Obj = dict[str, Any]


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def status(code: int, reason: str, message: str) -> httpx.Response:
    return httpx.Response(
        code,
        json={
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
        },
    )


class FakeApi:
    """Just enough of the API server: CRUD, merge patch, list, a scripted watch, auth."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.requests: list[httpx.Request] = []
        self.watch_events: list[Obj] = []
        self.hooks: list[Callable[[FakeApi], None]] = []
        self.rv = 100

    def add(self, plural: str, obj: Obj, namespace: str = "") -> None:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("creationTimestamp", "2024-01-01T00:00:00Z")
        self.objects[(plural, namespace, meta["name"])] = obj

    def find(self, plural: str, name: str, namespace: str = "") -> Obj | None:
        return self.objects.get((plural, namespace, name))

    def sent(self) -> list[tuple[str, str]]:
        return [(r.method, r.url.path) for r in self.requests]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        for hook in self.hooks:
            hook(self)
        if request.headers.get("authorization") != "Bearer good":
            return status(401, "Unauthorized", "Unauthorized")
        segs = request.url.path.strip("/").split("/")
        base, rest = (segs[:2], segs[2:]) if segs[0] == "api" else (segs[:3], segs[3:])
        group, version = ("", base[1]) if base[0] == "api" else (base[1], base[2])
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        kind = KINDS.by_plural(group, version, rest[0])
        if kind is None:
            return status(404, "NotFound", "the server could not find the requested resource")
        key = (kind.plural, ns, rest[1]) if len(rest) > 1 else None
        return self._serve(request, kind.plural, ns, key)

    def _serve(
        self, request: httpx.Request, plural: str, ns: str, key: tuple[str, str, str] | None
    ) -> httpx.Response:
        method, body = request.method, json.loads(request.content or b"null")
        if key is None and method == "GET":
            return self._list(request, plural, ns)
        if method == "POST":
            key = (plural, ns, body["metadata"]["name"])
            if key in self.objects:
                return status(409, "AlreadyExists", f'{plural} "{key[2]}" already exists')
            return self._store(key, body, 201)
        assert key is not None
        current = self.objects.get(key)
        if current is None:
            return status(404, "NotFound", f'{plural} "{key[2]}" not found')
        if method == "GET":
            return httpx.Response(200, json=current)
        if method == "DELETE":
            del self.objects[key]
            return httpx.Response(200, json={"kind": "Status", "status": "Success"})
        if method == "PATCH":
            assert request.headers["content-type"] == "application/merge-patch+json"
            return self._store(key, merge(current, body), 200)
        return self._store(key, body, 200)

    def _store(self, key: tuple[str, str, str], obj: Obj, code: int) -> httpx.Response:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        obj["metadata"].setdefault("creationTimestamp", "2024-01-01T00:00:00Z")
        self.objects[key] = obj
        return httpx.Response(code, json=obj)

    def _list(self, request: httpx.Request, plural: str, ns: str) -> httpx.Response:
        if request.url.params.get("watch") == "true":
            lines = b"".join(json.dumps(e).encode() + b"\n" for e in self.watch_events)
            return httpx.Response(200, content=lines)
        items = [
            o
            for (p, n, _), o in sorted(self.objects.items())
            if p == plural and (not ns or n == ns)
        ]
        selector = request.url.params.get("labelSelector")
        if selector:
            k, _, v = selector.partition("=")
            items = [o for o in items if (o["metadata"].get("labels") or {}).get(k) == v]
        return httpx.Response(
            200,
            json={"kind": "List", "items": items, "metadata": {"resourceVersion": str(self.rv)}},
        )


@pytest.fixture
def api() -> FakeApi:
    fake = FakeApi()
    fake.add(
        "hostsubnets",
        {
            "host": "node1",
            "hostIP": "192.168.50.11",
            "subnet": "10.128.0.0/23",
            "metadata": {"name": "node1"},
        },
    )
    fake.add("netnamespaces", {"metadata": {"name": "default"}, "netname": "default", "netid": 0})
    fake.add("netnamespaces", {"metadata": {"name": "a"}, "netname": "a", "netid": 11})
    fake.add("netnamespaces", {"metadata": {"name": "b"}, "netname": "b", "netid": 12})
    fake.add(
        "pods",
        {"metadata": {"name": "web", "namespace": "shop"}, "status": {"phase": "Running"}},
        "shop",
    )
    return fake


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "config"
    write_kubeconfig(path, SERVER, b"fake-ca", "good")
    return path


def run(api: FakeApi, kubeconfig: Path, *args: str, stdin: str | None = None) -> Result:
    def factory(config: ClientConfig, *, log: Callable[[str], None] | None = None) -> ApiClient:
        return ApiClient(config, transport=httpx.MockTransport(api), log=log)

    state = CliState(make_client=factory)
    return CliRunner().invoke(cli, ["--kubeconfig", str(kubeconfig), *args], obj=state, input=stdin)


def one_error(result: Result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


# ---- get --------------------------------------------------------------------------------


def test_get_hostsubnets_table(api: FakeApi, kubeconfig: Path) -> None:
    result = run(api, kubeconfig, "get", "hostsubnets")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "NAME    HOST    HOST IP         SUBNET          AGE"
    assert lines[1].split()[:4] == ["node1", "node1", "192.168.50.11", "10.128.0.0/23"]
    assert api.sent() == [("GET", "/apis/network.openshift.io/v1/hostsubnets")]


def test_get_single_netnamespace_by_short_name(api: FakeApi, kubeconfig: Path) -> None:
    result = run(api, kubeconfig, "get", "netns", "a", "-n", "ignored")
    assert result.stdout.splitlines()[0].split() == ["NAME", "NETID", "AGE"]
    assert result.stdout.splitlines()[1].split()[:2] == ["a", "11"]
    assert api.sent() == [("GET", "/apis/network.openshift.io/v1/netnamespaces/a")]


def test_namespace_defaults_and_all_namespaces(api: FakeApi, kubeconfig: Path) -> None:
    doc = yaml.safe_load(kubeconfig.read_text())
    doc["contexts"][0]["context"]["namespace"] = "shop"
    kubeconfig.write_text(yaml.safe_dump(doc))
    assert run(api, kubeconfig, "get", "pods").stdout.splitlines()[1].startswith("web ")
    run(api, kubeconfig, "get", "pods", "-n", "other")
    result = run(api, kubeconfig, "get", "pods", "-A")
    assert result.stdout.splitlines()[0].startswith("NAMESPACE   NAME   READY   STATUS")
    assert [p for _, p in api.sent()] == [
        "/api/v1/namespaces/shop/pods",
        "/api/v1/namespaces/other/pods",
        "/api/v1/pods",
    ]
    assert (
        "No resources found in other namespace."
        in run(api, kubeconfig, "get", "pods", "-n", "other").stderr
    )


def test_get_output_formats_and_selector(api: FakeApi, kubeconfig: Path) -> None:
    as_json = json.loads(run(api, kubeconfig, "get", "hs", "node1", "-o", "json").stdout)
    assert as_json["kind"] == "HostSubnet" and as_json["subnet"] == "10.128.0.0/23"
    as_yaml = yaml.safe_load(run(api, kubeconfig, "get", "netnamespaces", "-o", "yaml").stdout)
    assert as_yaml["kind"] == "List"
    assert [i["metadata"]["name"] for i in as_yaml["items"]] == ["a", "b", "default"]
    names = run(api, kubeconfig, "get", "netns", "-o", "name").stdout.split()
    assert names[0] == "netnamespace.network.openshift.io/a"
    run(api, kubeconfig, "get", "hs", "-l", "zone=a", "--field-selector", "host=node1")
    assert dict(api.requests[-1].url.params) == {
        "labelSelector": "zone=a",
        "fieldSelector": "host=node1",
    }


def test_get_watch_prints_rows_as_events_arrive(api: FakeApi, kubeconfig: Path) -> None:
    api.watch_events = [
        {"type": "ADDED", "object": {"metadata": {"name": "c"}, "netid": 13}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "200"}}},
        {"type": "MODIFIED", "object": {"metadata": {"name": "a"}, "netid": 12}},
    ]
    result = run(api, kubeconfig, "get", "netnamespaces", "-w")
    assert result.exit_code == 0, result.output
    rows = [line.split()[:2] for line in result.stdout.splitlines()]
    assert rows == [
        ["NAME", "NETID"],
        ["a", "11"],
        ["b", "12"],
        ["default", "0"],
        ["c", "13"],
        ["a", "12"],
    ]
    watch = api.requests[-1]
    assert dict(watch.url.params) == {"watch": "true", "resourceVersion": "100"}
    out = run(api, kubeconfig, "get", "netns", "a", "-w", "-o", "json").stdout
    docs = [json.loads(d) for d in out.replace("}\n{", "}\x00{").split("\x00")]
    assert [d["netid"] for d in docs] == [11, 12]
    assert api.requests[-1].url.params["fieldSelector"] == "metadata.name=a"


def test_describe(api: FakeApi, kubeconfig: Path) -> None:
    result = run(api, kubeconfig, "describe", "hostsubnet", "node1")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["Name:", "node1"]
    assert "Subnet:             10.128.0.0/23" in lines
    assert one_error(run(api, kubeconfig, "describe", "hs")).startswith("error: describe needs")


# ---- errors -----------------------------------------------------------------------------


def test_unknown_kind_is_one_line(api: FakeApi, kubeconfig: Path) -> None:
    line = one_error(run(api, kubeconfig, "get", "gadgets"))
    assert line == 'error: the server doesn\'t have a resource type "gadgets"'
    assert api.requests == []


def test_not_found_is_one_line(api: FakeApi, kubeconfig: Path) -> None:
    line = one_error(run(api, kubeconfig, "get", "hs", "nodeX"))
    assert line == 'error: from server (NotFound): hostsubnets "nodeX" not found'


def test_bad_token_is_unauthorized(api: FakeApi, tmp_path: Path) -> None:
    path = tmp_path / "bad"
    write_kubeconfig(path, SERVER, b"ca", "wrong")
    line = one_error(run(api, path, "get", "hs"))
    assert line.startswith("error: you must be logged in to the server (Unauthorized)")


def test_unreachable_master(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "config"
    write_kubeconfig(path, f"http://127.0.0.1:{port}", b"", "t")
    doc = yaml.safe_load(path.read_text())
    del doc["clusters"][0]["cluster"]["certificate-authority-data"]
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(cli, ["--kubeconfig", str(path), "get", "hs"])
    assert one_error(result).startswith(
        f"error: cannot reach the podnet master at http://127.0.0.1:{port}: "
    )


def test_missing_kubeconfig_and_usage_errors(api: FakeApi, tmp_path: Path) -> None:
    assert "does not exist" in one_error(run(api, tmp_path / "none", "get", "hs"))
    assert "Missing argument" in one_error(run(api, tmp_path / "none", "get"))
    assert "No such option" in one_error(run(api, tmp_path / "none", "get", "hs", "--nope"))


def test_global_flags_may_follow_the_subcommand(api: FakeApi, kubeconfig: Path) -> None:
    def factory(config: ClientConfig, *, log: Callable[[str], None] | None = None) -> ApiClient:
        return ApiClient(config, transport=httpx.MockTransport(api), log=log)

    args = ["get", "hs", "--kubeconfig", str(kubeconfig), "-v"]
    result = CliRunner().invoke(cli, args, obj=CliState(make_client=factory))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("NAME ")
    assert "GET https://api.test:6443/apis/" in result.stderr


def test_help_lists_every_command_including_master() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in ("adm", "apply", "delete", "describe", "get", "master"):
        assert f"  {name} " in result.stdout
    assert CliRunner().invoke(cli, ["master", "--help"]).exit_code == 0


def test_verbose_logs_requests(api: FakeApi, kubeconfig: Path) -> None:
    result = run(api, kubeconfig, "get", "hs", "-v")
    assert f"GET {SERVER}/apis/network.openshift.io/v1/hostsubnets 200 OK" in result.stderr


def test_console_script_never_prints_a_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from podnet.cli.main import main; main()",
            "--kubeconfig",
            str(tmp_path / "missing"),
            "get",
            "hs",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr == f"error: kubeconfig {tmp_path / 'missing'} does not exist\n"


# ---- apply ------------------------------------------------------------------------------

HS_YAML = """\
apiVersion: network.openshift.io/v1
kind: HostSubnet
metadata:
  name: node2
host: node2
hostIP: 192.168.50.12
subnet: 10.128.2.0/23
---
apiVersion: v1
kind: Pod
metadata:
  name: api
spec:
  nodeName: node2
"""


def test_apply_creates_then_is_unchanged_then_configured(
    api: FakeApi, kubeconfig: Path, tmp_path: Path
) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(HS_YAML)
    result = run(api, kubeconfig, "apply", "-f", str(manifest), "-n", "shop")
    assert result.stdout.splitlines() == ["hostsubnet/node2 created", "pod/api created"]
    assert ("POST", "/api/v1/namespaces/shop/pods") in api.sent()
    created = api.find("hostsubnets", "node2")
    assert created is not None and created["subnet"] == "10.128.2.0/23"
    assert json.loads(created["metadata"]["annotations"][LAST_APPLIED])["hostIP"] == (
        "192.168.50.12"
    )

    api.requests.clear()
    result = run(api, kubeconfig, "apply", "-f", str(manifest), "-n", "shop")
    assert result.stdout.splitlines() == ["hostsubnet/node2 unchanged", "pod/api unchanged"]
    assert {m for m, _ in api.sent()} == {"GET"}

    manifest.write_text(HS_YAML.replace("192.168.50.12", "192.168.50.99"))
    result = run(api, kubeconfig, "apply", "-f", str(manifest), "-n", "shop")
    assert result.stdout.splitlines()[0] == "hostsubnet/node2 configured"
    patch = next(r for r in api.requests if r.method == "PATCH")
    assert patch.headers["content-type"] == "application/merge-patch+json"
    assert json.loads(patch.content)["hostIP"] == "192.168.50.99"
    assert api.find("hostsubnets", "node2")["hostIP"] == "192.168.50.99"  # type: ignore[index]


def test_apply_json_list_from_stdin(api: FakeApi, kubeconfig: Path) -> None:
    items = [
        {
            "apiVersion": "network.openshift.io/v1",
            "kind": "NetNamespace",
            "metadata": {"name": n},
            "netname": n,
            "netid": 20,
        }
        for n in ("x", "y")
    ]
    doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent="\t")
    result = run(api, kubeconfig, "apply", "-f", "-", stdin=doc)
    assert result.stdout.splitlines() == ["netnamespace/x created", "netnamespace/y created"]


def test_apply_checks_every_document_before_changing_anything(
    api: FakeApi, kubeconfig: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(HS_YAML + "---\napiVersion: v9\nkind: Gadget\nmetadata: {name: g}\n")
    line = one_error(run(api, kubeconfig, "apply", "-f", str(bad)))
    assert line == f'error: {bad}: no matches for kind "Gadget" in version "v9"'
    assert api.requests == []
    bad.write_text("kind: [unclosed\n")
    assert f"{bad} is not valid YAML or JSON" in one_error(
        run(api, kubeconfig, "apply", "-f", str(bad))
    )
    assert "does not exist" in one_error(run(api, kubeconfig, "apply", "-f", "/nonexistent"))
    mixed = tmp_path / "ns.yaml"
    mixed.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\n")
    assert "does not match" in one_error(run(api, kubeconfig, "apply", "-f", str(mixed), "-n", "b"))


# ---- delete -----------------------------------------------------------------------------


def test_delete_names_reports_each_and_fails_on_missing(api: FakeApi, kubeconfig: Path) -> None:
    result = run(api, kubeconfig, "delete", "netns", "a", "missing", "b")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == ['netnamespace "a" deleted', 'netnamespace "b" deleted']
    assert result.stderr.strip() == (
        'error: from server (NotFound): netnamespaces "missing" not found'
    )
    assert ("DELETE", "/apis/network.openshift.io/v1/netnamespaces/b") in api.sent()
    quiet = run(api, kubeconfig, "delete", "netns", "a", "--ignore-not-found")
    assert quiet.exit_code == 0 and quiet.stdout == ""


def test_delete_from_file_and_type_slash_name(
    api: FakeApi, kubeconfig: Path, tmp_path: Path
) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(HS_YAML)
    run(api, kubeconfig, "apply", "-f", str(manifest))
    result = run(api, kubeconfig, "delete", "-f", str(manifest))
    assert result.stdout.splitlines() == ['hostsubnet "node2" deleted', 'pod "api" deleted']
    assert ("DELETE", "/api/v1/namespaces/default/pods/api") in api.sent()
    assert run(api, kubeconfig, "delete", "hs/node1").exit_code == 0
    assert api.find("hostsubnets", "node1") is None
    assert "give the name" in one_error(run(api, kubeconfig, "delete", "hs"))


# ---- adm pod-network --------------------------------------------------------------------


def fake_master(polls_before_apply: int) -> Callable[[FakeApi], None]:
    """Acts on the change annotation after a few requests, as the VNID controller would."""
    seen: dict[str, int] = {}

    def hook(api: FakeApi) -> None:
        for (plural, _, name), obj in api.objects.items():
            change = (obj["metadata"].get("annotations") or {}).get(CHANGE_NETWORK)
            if plural != "netnamespaces" or change is None:
                continue
            seen[name] = seen.get(name, 0) + 1
            if seen[name] <= polls_before_apply:
                continue
            if change.startswith("join:"):
                obj["netid"] = api.objects[("netnamespaces", "", change[5:])]["netid"]
            else:
                obj["netid"] = 0 if change == "global" else 99
            del obj["metadata"]["annotations"][CHANGE_NETWORK]

    return hook


def test_join_projects_annotates_then_waits(api: FakeApi, kubeconfig: Path) -> None:
    api.hooks.append(fake_master(polls_before_apply=3))
    result = run(api, kubeconfig, "adm", "pod-network", "join-projects", "--to=b", "a")
    assert result.exit_code == 0, result.output
    assert result.stdout == "netnamespace/a joined to b (netid 12)\n"
    patch = next(r for r in api.requests if r.method == "PATCH")
    assert patch.url.path == "/apis/network.openshift.io/v1/netnamespaces/a"
    assert json.loads(patch.content) == {"metadata": {"annotations": {CHANGE_NETWORK: "join:b"}}}
    polls = [r for r in api.requests if r.method == "GET" and r.url.path.endswith("/a")]
    assert len(polls) >= 3


def test_isolate_and_make_global(api: FakeApi, kubeconfig: Path) -> None:
    api.hooks.append(fake_master(polls_before_apply=0))
    result = run(api, kubeconfig, "adm", "pod-network", "isolate-projects", "a", "b")
    assert result.stdout.splitlines() == [
        "netnamespace/a isolated (netid 99)",
        "netnamespace/b isolated (netid 99)",
    ]
    result = run(api, kubeconfig, "adm", "pod-network", "make-projects-global", "a")
    assert result.stdout == "netnamespace/a made global (netid 0)\n"


def test_missing_projects_fail_before_any_change(api: FakeApi, kubeconfig: Path) -> None:
    line = one_error(run(api, kubeconfig, "adm", "pod-network", "join-projects", "--to=zz", "a"))
    assert line == 'error: netnamespace "zz" (the --to project) not found'
    line = one_error(run(api, kubeconfig, "adm", "pod-network", "isolate-projects", "a", "nope"))
    assert line == 'error: netnamespace "nope" not found'
    assert all(r.method == "GET" for r in api.requests)


def test_timeout_when_master_never_acts(api: FakeApi, kubeconfig: Path) -> None:
    result = run(api, kubeconfig, "adm", "pod-network", "isolate-projects", "a", "--timeout", "0.3")
    assert one_error(result) == (
        'error: the master did not apply the change to netnamespace "a" within 0.3s '
        "(is the master running in multitenant or networkpolicy mode?)"
    )


def test_subnet_plugin_is_refused(api: FakeApi, kubeconfig: Path) -> None:
    api.add(
        "clusternetworks",
        {"metadata": {"name": "default"}, "pluginName": "redhat/openshift-ovs-subnet"},
    )
    line = one_error(run(api, kubeconfig, "adm", "pod-network", "make-projects-global", "a"))
    assert "redhat/openshift-ovs-subnet" in line
    assert all(r.method == "GET" for r in api.requests)


def test_apply_sends_status_when_it_creates(api: FakeApi, kubeconfig: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "node.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Node\nmetadata: {name: n9}\n"
        "status:\n  addresses: [{type: InternalIP, address: 192.0.2.9}]\n"
    )
    result = run(api, kubeconfig, "apply", "-f", str(manifest))
    assert result.stdout.strip() == "node/n9 created"
    created = api.find("nodes", "n9")
    assert created is not None
    assert created["status"]["addresses"] == [{"type": "InternalIP", "address": "192.0.2.9"}]
