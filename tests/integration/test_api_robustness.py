"""Issue 8, finding 6: bad input gets a clear 4xx and changes nothing (real master, real etcd).

Each test sends what the attacker sent and checks the answer and that the store's keys
under the master's prefix did not move.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for, namespace, pod
from podnet.testing.processes import MasterProcess

PODS = "/api/v1/namespaces/default/pods"
NS = "/api/v1/namespaces"
JSON = {"Content-Type": "application/json"}


async def _keys(etcd: EtcdProcess, prefix: str) -> dict[str, int]:
    store = EtcdStore(etcd.endpoint)
    await store.connect()
    try:
        kvs, _ = await store.list(prefix)
        return {kv.key: kv.mod_revision for kv in kvs}
    finally:
        await store.close()


def stored(etcd: EtcdProcess, prefix: str) -> dict[str, int]:
    """Every key under ``prefix`` with its mod revision."""
    return asyncio.run(_keys(etcd, prefix))


@contextmanager
def unchanged(etcd: EtcdProcess, prefix: str) -> Iterator[None]:
    before = stored(etcd, prefix)
    yield
    assert stored(etcd, prefix) == before


def status_of(answer: httpx.Response, code: int) -> dict[str, Any]:
    assert answer.status_code == code, answer.text[:500]
    body: dict[str, Any] = answer.json()
    assert body["kind"] == "Status" and body["code"] == code
    return body


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value


def test_deep_nesting_is_400_not_recursion(master: MasterProcess, etcd: EtcdProcess) -> None:
    with client_for(master.kubeconfig) as api:
        assert api.post(PODS, json=pod("target")).status_code == 201
        deep = pod("deep")
        deep["spec"]["extra"] = nested(900)
        yaml_body = "apiVersion: v1\nkind: Pod\nmetadata: {name: y}\nspec: " + "[" * 900 + "]" * 900
        merge = {"metadata": {"annotations": nested(900)}}
        json_patch = [{"op": "add", "path": "/metadata/x", "value": nested(900)}]
        with unchanged(etcd, master.prefix):
            body = status_of(api.post(PODS, json=deep), 400)
            assert "nested too deeply" in body["message"]
            yaml_headers = {"Content-Type": "application/yaml"}
            status_of(api.post(PODS, content=yaml_body, headers=yaml_headers), 400)
            for ctype, patch in (
                ("application/merge-patch+json", merge),
                ("application/strategic-merge-patch+json", merge),
                ("application/json-patch+json", json_patch),
            ):
                answer = api.patch(
                    f"{PODS}/target", content=json.dumps(patch), headers={"Content-Type": ctype}
                )
                status_of(answer, 400)
            # Deeper than the JSON parser's own recursion limit.
            raw = '{"a":' * 100_000 + "1" + "}" * 100_000
            status_of(api.post(PODS, content=raw, headers=JSON), 400)


def test_delete_options_of_the_wrong_shape_are_400(
    master: MasterProcess, etcd: EtcdProcess
) -> None:
    with client_for(master.kubeconfig) as api:
        assert api.post(PODS, json=pod("keep")).status_code == 201
        with unchanged(etcd, master.prefix):
            for options in (
                {"preconditions": [1]},
                {"preconditions": {"resourceVersion": 5}},
                {"propagationPolicy": "Sideways"},
                {"gracePeriodSeconds": "soon"},
                [1],
            ):
                answer = api.request("DELETE", f"{PODS}/keep", json=options)
                status_of(answer, 400)
            wrong_uid = {"preconditions": {"uid": "not-the-uid"}}
            status_of(api.request("DELETE", f"{PODS}/keep", json=wrong_uid), 409)
        uid = api.get(f"{PODS}/keep").json()["metadata"]["uid"]
        right = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        assert api.request("DELETE", f"{PODS}/keep", json=right).status_code == 200


def test_bad_resource_versions(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        current = int(api.get(NS).json()["metadata"]["resourceVersion"])
        for rv in ("1e23", "abc", "-1", str(10**23), " 1"):
            status_of(api.get(NS, params={"watch": "1", "resourceVersion": rv}), 400)
            status_of(api.get(NS, params={"resourceVersion": rv}), 400)
        future = str(current + 10**6)
        # A 504 Status is the server's own answer: a server that hung instead would meet
        # the client's timeout, which raises rather than returning a body.
        for params in ({"watch": "1", "resourceVersion": future}, {"resourceVersion": future}):
            body = status_of(api.get(NS, params=params), 504)
            assert body["reason"] == "Timeout"
            assert body["message"].startswith("Too large resource version")
            assert body["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


def test_non_ascii_token_is_401(master: MasterProcess) -> None:
    with client_for(master.kubeconfig, token=None) as api:
        for token in ("Bearer t\xf6ken".encode(), "Bearer 令牌".encode(), b"Bearer \xff\xfe"):
            status_of(api.get(NS, headers={"Authorization": token}), 401)


def test_oversized_objects_are_413(master: MasterProcess, etcd: EtcdProcess) -> None:
    with client_for(master.kubeconfig, timeout=60) as api, unchanged(etcd, master.prefix):
        big = pod("big")
        big["metadata"]["annotations"] = {"blob": "x" * (2 * 1024 * 1024)}
        assert api.post(PODS, json=big).status_code in (413, 422)  # annotations cap
        big["metadata"]["annotations"] = {"blob": "x" * (3 * 1024 * 1024)}
        body = status_of(api.post(PODS, json=big), 413)  # over the request body limit
        assert body["reason"] == "RequestEntityTooLarge"
        # Valid, under the request limit, but over the stored-object limit (1 MiB).
        many = pod("many")
        many["spec"]["containers"][0]["command"] = ["x" * 1000] * 1500
        body = status_of(api.post(PODS, json=many), 413)
        assert "etcd" in body["message"]


def test_watch_with_bad_timeout_is_400_before_any_event(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        for value in ("abc", "-5", "1.5", "9" * 30):
            answer = api.get(NS, params={"watch": "true", "timeoutSeconds": value})
            assert "timeoutSeconds" in status_of(answer, 400)["message"]


def test_nan_and_infinity_are_refused(master: MasterProcess, etcd: EtcdProcess) -> None:
    with client_for(master.kubeconfig) as api:
        base = json.dumps(pod("nan"))
        with unchanged(etcd, master.prefix):
            for number in ("NaN", "Infinity", "-Infinity", "1e400"):
                raw = base.replace('"image": "busybox"', f'"image": "busybox", "x": {number}')
                status_of(api.post(PODS, content=raw, headers=JSON), 400)
            yaml_headers = {"Content-Type": "application/yaml"}
            for number in (".nan", ".inf", "-.Inf"):
                doc = f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: y\n  x: {number}\n"
                status_of(api.post(PODS, content=doc, headers=yaml_headers), 400)
            alias = "apiVersion: v1\nkind: Namespace\nmetadata: &m {name: a}\nspec: *m\n"
            status_of(api.post(NS, content=alias, headers=yaml_headers), 400)
        assert api.get(PODS).json()["items"] == []


def test_put_into_another_namespace_is_400(master: MasterProcess, etcd: EtcdProcess) -> None:
    with client_for(master.kubeconfig) as api:
        assert api.post(NS, json=namespace("other")).status_code == 201
        created = api.post(PODS, json=pod("p")).json()
        moved = dict(created, metadata={**created["metadata"], "namespace": "other"})
        with unchanged(etcd, master.prefix):
            body = status_of(api.put(f"{PODS}/p", json=moved), 400)
            assert "does not match the namespace sent on the request" in body["message"]
        assert api.get("/api/v1/namespaces/other/pods").json()["items"] == []


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "-1"},
        {"limit": "abc"},
        {"continue": "garbage!"},
        {"continue": "eyJydiI6IDF9"},  # base64 JSON without a start key
        {"watch": "maybe"},
        {"allowWatchBookmarks": "2"},
        {"resourceVersionMatch": "Newest", "resourceVersion": "1"},
        {"resourceVersionMatch": "Exact"},
        {"fieldSelector": "metadata.name"},
        {"labelSelector": "a in (b"},
        {"dryRun": "Some"},
        {"propagationPolicy": "Later"},
        {"gracePeriodSeconds": "x"},
        {"fieldValidation": "Lenient"},
        {"fieldManager": "m" * 200},
        {"pretty": "very"},
    ],
)
def test_every_query_parameter_is_checked(master: MasterProcess, params: dict[str, str]) -> None:
    with client_for(master.kubeconfig) as api:
        status_of(api.get(NS, params=params), 400)


def test_limit_and_continue_page_through_a_list(master: MasterProcess, etcd: EtcdProcess) -> None:
    with client_for(master.kubeconfig) as api:
        for i in range(5):
            assert api.post(NS, json=namespace(f"page-{i}")).status_code == 201
        everything = sorted(n["metadata"]["name"] for n in api.get(NS).json()["items"])
        seen, token, revisions = [], "", set()
        for _ in range(20):
            params = {"limit": "2", **({"continue": token} if token else {})}
            page = api.get(NS, params=params).json()
            assert len(page["items"]) <= 2
            seen += [n["metadata"]["name"] for n in page["items"]]
            revisions.add(page["metadata"]["resourceVersion"])
            token = page["metadata"].get("continue", "")
            if not token:
                break
        assert seen == everything and len(revisions) == 1
        first = api.get(NS, params={"limit": "1"}).json()["metadata"]
        assert first["remainingItemCount"] == len(everything) - 1
        with_rv = {"limit": "1", "continue": first["continue"], "resourceVersion": "5"}
        status_of(api.get(NS, params=with_rv), 400)
        # Once etcd has compacted the first page's revision, the token has expired: 410.
        latest = api.post(NS, json=namespace("page-late")).json()["metadata"]["resourceVersion"]
        asyncio.run(_compact(etcd, int(latest)))
        expired = api.get(NS, params={"limit": "1", "continue": first["continue"]})
        assert status_of(expired, 410)["reason"] == "Expired"


async def _compact(etcd: EtcdProcess, revision: int) -> None:
    store = EtcdStore(etcd.endpoint)
    await store.connect()
    try:
        await store.compact(revision)
    finally:
        await store.close()
