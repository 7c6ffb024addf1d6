"""Schemathesis against the master's own OpenAPI: no 5xx, and a rejected request stores nothing.

The OpenAPI v3 documents the master serves (one per group version, listed at
``/openapi/v3``) are merged into one document; schemathesis generates requests for every
operation in it, half inside the schema and half outside it (negative mode), and each is
sent to a real ``podnet master`` on real etcd with the admin token.

"Stores nothing" is checked on etcd itself: every key under the master's prefix with its
mod revision is read before and after each rejected request. Controllers may write at any
time (a namespace created by an earlier case gets its NetNamespace), so a change counts
against a request only when it is the object that request named.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from collections import Counter
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for, kubeconfig_parts
from podnet.testing.processes import MasterProcess

# Every operation in both modes, with the same share each: 2,000 cases are 12 per
# operation and mode (84 operations). Generating a case is most of a case's cost (~35 ms
# of schemathesis' strategies); 5,000 took 180 s alone and 437 s in the whole suite on CI.
# PODNET_FUZZ_CASES=5000 (or more) for a deeper run.
TOTAL_CASES = int(os.environ.get("PODNET_FUZZ_CASES", "2000"))
TRUE = ("1", "t", "T", "true", "TRUE", "True")
T = TypeVar("T")


class EtcdKeys:
    """A synchronous view of the keys under one prefix, over a loop in its own thread."""

    def __init__(self, endpoint: str, prefix: str) -> None:
        self.prefix = prefix
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.store = EtcdStore(endpoint)
        self._run(self.store.connect())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def snapshot(self) -> dict[str, int]:
        kvs, _ = self._run(self.store.list(self.prefix))
        return {kv.key: kv.mod_revision for kv in kvs}

    def close(self) -> None:
        self._run(self.store.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


@pytest.fixture
def etcd_keys(etcd: EtcdProcess, master: MasterProcess) -> Iterator[EtcdKeys]:
    keys = EtcdKeys(etcd.endpoint, master.prefix)
    try:
        yield keys
    finally:
        keys.close()


def merged_openapi(master: MasterProcess) -> dict[str, Any]:
    """One OpenAPI document from every group version the master serves."""
    merged: dict[str, Any] = {
        "openapi": "3.0.0",
        "info": {"title": "podnet (merged)", "version": "1"},
        "paths": {},
        "components": {"schemas": {}},
    }
    with client_for(master.kubeconfig) as api:
        root = api.get("/openapi/v3").json()
        for entry in root["paths"].values():
            doc = api.get(entry["serverRelativeURL"]).json()
            merged["paths"].update(doc["paths"])
            merged["components"]["schemas"].update(doc["components"]["schemas"])
    for schema in merged["components"]["schemas"].values():
        close(schema)
    return merged


def close(schema: dict[str, Any]) -> None:
    """Generate only the declared fields in positive mode, so some creates succeed.

    The served schemas are open (the master validates kinds itself); closed here, a
    positive case is a plain ``{apiVersion, kind, metadata: {name}}`` object,
    which a Namespace or an Event accepts, so the fuzz also deletes, patches and
    replaces objects that exist, and controllers react to them while it runs.
    """
    schema["additionalProperties"] = False
    schema["required"] = ["metadata"]
    meta = schema["properties"]["metadata"]
    meta.update(additionalProperties=False, required=["name"])
    meta["properties"].pop("labels", None)  # random label keys are all invalid


def named_key(case: Any) -> tuple[str, str] | None:
    """(resource plural, object name) a request names, if it names one."""
    path = case.operation.path.rstrip("/")
    plural = path.split("/")[-2] if path.endswith("{name}") else path.split("/")[-1]
    name = (case.path_parameters or {}).get("name")
    body = case.body if isinstance(case.body, dict) else {}
    meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    name = name or meta.get("name")
    return (plural, name) if isinstance(name, str) and name else None


def touched(before: dict[str, int], after: dict[str, int], named: tuple[str, str]) -> list[str]:
    """Changed keys that are the object ``named`` (``/<plural>/[<ns>/]<name>``)."""
    plural, name = named
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    return sorted(k for k in changed if f"/{plural}/" in k and k.endswith(f"/{name}"))


def bound_watch(case: Any) -> None:
    """A generated watch may stay open for up to an hour: keep it to one second."""
    query = case.query or {}
    if str(query.get("watch")) in TRUE or query.get("watch") is True:
        query["timeoutSeconds"] = 1
        case.query = query


@pytest.mark.slow
@pytest.mark.timeout(900)  # 2,000 cases: ~1 min alone; 5,000: 3 min, more on a loaded machine
def test_schemathesis_no_5xx_and_rejections_store_nothing(
    master: MasterProcess, etcd_keys: EtcdKeys, tmp_path: Path
) -> None:
    server, ca, token = kubeconfig_parts(master.kubeconfig)
    (tmp_path / "ca.pem").write_bytes(ca)
    session = requests.Session()
    ca_file = str(tmp_path / "ca.pem")
    headers = {"Authorization": f"Bearer {token}"}
    schema = schemathesis.openapi.from_dict(merged_openapi(master))
    operations = [result.ok() for result in schema.get_all_operations()]
    per_operation = math.ceil(TOTAL_CASES / (2 * len(operations)))
    codes: Counter[int] = Counter()
    server_errors: list[str] = []
    stored_by_rejects: list[str] = []

    def send(case: Any) -> None:
        bound_watch(case)
        named = named_key(case) if case.method != "GET" else None  # a GET cannot store
        before = etcd_keys.snapshot() if named is not None else {}
        try:
            response = case.call(
                base_url=server, session=session, headers=headers, timeout=20, verify=ca_file
            )
        except (requests.RequestException, httpx.HTTPError) as exc:
            server_errors.append(f"{case.method} {case.formatted_path}: no answer ({exc})")
            return
        codes[response.status_code] += 1
        if response.status_code >= 500:
            server_errors.append(
                f"{case.method} {case.formatted_path} {case.query}: "
                f"{response.status_code} {response.text[:200]}"
            )
        if response.status_code >= 400 and named is not None:
            changed = touched(before, etcd_keys.snapshot(), named)
            if changed:
                stored_by_rejects.append(f"{case.method} {case.formatted_path}: {changed}")

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode)

            @settings(
                max_examples=per_operation,
                phases=[Phase.generate],
                derandomize=True,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy)
            def run(case: Any) -> None:
                send(case)

            run()

    total = sum(codes.values())
    print(f"schemathesis: {total} cases over {len(operations)} operations; codes {dict(codes)}")
    assert total >= TOTAL_CASES
    assert not server_errors, "\n".join(server_errors[:20])
    assert not stored_by_rejects, "\n".join(stored_by_rejects[:20])
    assert codes[201] > 0 and codes[200] > 0  # the run reached the success paths too
