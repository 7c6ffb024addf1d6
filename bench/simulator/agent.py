"""One simulated node agent: registers, heartbeats, waits for its subnet, watches.

What it sends follows ``podnet.agent``: GET then POST of its Node (InternalIP and
Hostname), the Lease ``kube-node-lease/<node>`` renewed every quarter of its duration by
one PUT over the Lease written last (``podnet.agent.heartbeat``'s own helpers build it),
its HostSubnet listed and watched alone until the master has allocated it
(``podnet.agent.objectwait``; the older GET every ``POLL_SECONDS`` is kept as an option),
then the Node's Ready condition set through the status subresource. Requests share one
keep-alive HTTPS connection; each watched kind has its own. Watches reconnect from the
last resourceVersion when the server ends them and list again after 410 Gone, as the
agent's reflector does.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from podnet.agent.heartbeat import lease_object, micro_time, renewed
from podnet.model.kinds import CLUSTER_NETWORK, HOST_SUBNET, KINDS, LEASE, NODE, Kind
from podnet.model.schemas_coordination import NODE_LEASE_NAMESPACE
from simulator.wire import VERSION, Endpoint, WatchStream, auth_header, open_watch

POLL_SECONDS = 0.5  # podnet.agent.agent.POLL_SECONDS: the HostSubnet wait (default)
WATCH_SECONDS = (300, 600)  # podnet.agent: the server ends each watch after this long
RETRY = (0.2, 5.0)  # first and largest retry delay, jittered

Obj = dict[str, Any]


class Failed(Exception):
    """A request answered with a status the agent does not retry."""


def collection_path(kind: Kind, namespace: str | None = None) -> str:
    path = kind.base_path()
    if kind.namespaced and namespace:
        path += f"/namespaces/{namespace}"
    return f"{path}/{kind.plural}"


def kind_named(plural: str) -> Kind:
    return next(k for k in KINDS.kinds if k.plural == plural)


@dataclass(frozen=True)
class AgentSpec:
    name: str
    token: str  # "": the endpoint's TLS context holds a client certificate (mTLS)
    ip: str


@dataclass
class Tally:
    """What the watchers of one worker saw, merged: per pod event, how many watchers
    saw it, when the first and the last did (``time.monotonic``, system-wide) and which
    node was the last."""

    per_version: dict[int, list[Any]] = field(default_factory=dict)
    expired: int = 0  # 410 Gone answers (each followed by a relist)
    reconnects: int = 0  # watches the server ended that were opened again
    errors: dict[str, int] = field(default_factory=dict)
    retries: int = 0  # requests retried after a 5xx, 429 or a broken connection
    heartbeats: int = 0

    def seen(self, version: int, node: str) -> None:
        now = time.monotonic()
        entry = self.per_version.get(version)
        if entry is None:
            self.per_version[version] = [1, now, now, node]
        else:
            entry[0] += 1
            entry[2] = now
            entry[3] = node

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


def node_object(name: str, ip: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name},
            ]
        },
    }


def subnet_into(found: asyncio.Future[str]) -> Callable[[bytes], None]:
    """A watch line reader that resolves ``found`` with the first subnet it sees."""

    def line(raw: bytes) -> None:
        obj = json.loads(raw).get("object") or {}
        if obj.get("subnet") and not found.done():
            found.set_result(str(obj["subnet"]))

    return line


def ready_condition() -> Obj:
    now = micro_time()[:19] + "Z"
    return {
        "type": "Ready",
        "status": "True",
        "reason": "PodnetReady",
        "message": "podnet node agent is serving CNI requests",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


class SimAgent:
    """One node's API traffic."""

    def __init__(
        self,
        spec: AgentSpec,
        endpoint: Endpoint,
        tally: Tally,
        lease_seconds: int = 40,
        poll_seconds: float = POLL_SECONDS,
        subnet_wait: str = "watch",
    ) -> None:
        self.spec = spec
        self.endpoint = endpoint
        self.tally = tally
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.subnet_wait = subnet_wait  # "watch" (the agent since objectwait) or "poll"
        self.counts: dict[str, int] = {}  # kind plural -> events seen (bookmarks aside)
        self.versions: dict[str, int] = {}  # kind plural -> last resourceVersion seen
        self.opened: dict[str, list[float]] = {}  # kind plural -> when each watch opened
        self.subnet = ""
        self._session: aiohttp.ClientSession | None = None
        self._lease: Obj | None = None  # the Lease as last written
        self._streams: set[WatchStream] = set()

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.endpoint.context, limit=1)
            self._session = aiohttp.ClientSession(
                base_url=f"https://{self.endpoint.host}:{self.endpoint.port}",
                connector=connector,
                headers=auth_header(self.spec.token)
                | {"Accept": "application/json", "User-Agent": "podnet-sim"},
                timeout=aiohttp.ClientTimeout(total=60),
            )
        return self._session

    async def call(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        params: dict[str, str] | None = None,
    ) -> tuple[int, Obj]:
        """One request, retried (jittered backoff) on 5xx, 429 and broken connections."""
        delay = RETRY[0]
        while True:
            try:
                request = self.session().request(method, path, json=body, params=params)
                async with request as answer:
                    payload = await answer.json(content_type=None) if answer.status < 500 else {}
                    if answer.status < 500 and answer.status != 429:
                        return answer.status, payload or {}
                    self.tally.error(f"{method} {answer.status}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.tally.error(f"{method} {type(exc).__name__}")
            self.tally.retries += 1
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, RETRY[1])

    async def expect(
        self,
        method: str,
        path: str,
        body: Obj | None,
        *ok: int,
        params: dict[str, str] | None = None,
    ) -> Obj:
        status, payload = await self.call(method, path, body, params)
        if status not in ok:
            raise Failed(f"{method} {path}: {status} {payload.get('message', '')}")
        return payload

    # ---- start-up -------------------------------------------------------------------

    async def register(self) -> None:
        """GET the Node, POST it when missing (a taken name from a retried POST is fine)."""
        path = f"{collection_path(NODE)}/{self.spec.name}"
        status, _ = await self.call("GET", path)
        if status == 404:
            body = node_object(self.spec.name, self.spec.ip)
            await self.expect("POST", collection_path(NODE), body, 201, 409)

    async def renew_lease(self) -> None:
        """As ``podnet.agent.heartbeat``: PUT over the Lease written last; read it first
        only at start and after a conflict (then renew again at once, as the agent does)."""
        path = f"{collection_path(LEASE, NODE_LEASE_NAMESPACE)}/{self.spec.name}"
        for _ in range(3):
            now = micro_time()
            lease, self._lease = self._lease, None
            if lease is None:
                status, lease = await self.call("GET", path)
                if status == 404:
                    lease = None
            if lease is None:
                body = lease_object(self.spec.name, self.lease_seconds, now)
                collection = collection_path(LEASE, NODE_LEASE_NAMESPACE)
                self._lease = await self.expect("POST", collection, body, 201)
                break
            body = renewed(lease, self.spec.name, self.lease_seconds, now)
            status, written = await self.call("PUT", path, body)
            if status == 200:
                self._lease = written
                break
            if status != 409:
                raise Failed(f"PUT {path}: {status} {written.get('message', '')}")
        self.tally.heartbeats += 1

    async def heartbeat(self) -> None:
        """After the first renewal (``renew_lease`` at start-up), renew for ever every
        quarter of the lease; failures are counted, not fatal. The first wait is a random
        part of the period, once: nodes that did not boot in the same second do not renew
        in the same second, and 5,000 agents started together here should not either."""
        interval = self.lease_seconds / 4
        await asyncio.sleep(random.uniform(0, interval))
        while True:
            try:
                await self.renew_lease()
            except Failed as exc:
                self.tally.error(f"lease {exc}"[:80])
            await asyncio.sleep(interval)

    async def wait_for_subnet(self) -> str:
        if self.subnet_wait == "watch":
            return await self.watch_for_subnet()
        path = f"{collection_path(HOST_SUBNET)}/{self.spec.name}"
        while True:
            status, subnet = await self.call("GET", path)
            if status == 200 and subnet.get("subnet"):
                self.subnet = str(subnet["subnet"])
                return self.subnet
            await asyncio.sleep(self.poll_seconds)

    async def watch_for_subnet(self) -> str:
        """List and watch this node's HostSubnet alone (``fieldSelector=metadata.name``),
        as ``podnet.agent.objectwait`` does, until it has a subnet; then read ClusterNetwork
        ``default`` the same way (it exists: one list)."""
        path = collection_path(HOST_SUBNET)
        query = {"fieldSelector": f"metadata.name={self.spec.name}"}
        while True:
            listing = await self.expect("GET", path, None, 200, params=query)
            items = listing.get("items") or []
            if items and items[0].get("subnet"):
                self.subnet = str(items[0]["subnet"])
                break
            found: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            watch = query | {
                "watch": "true",
                "resourceVersion": str(listing["metadata"]["resourceVersion"]),
                "timeoutSeconds": str(random.randint(*WATCH_SECONDS)),
            }
            stream = await open_watch(
                self.endpoint, path, watch, self.spec.token, lambda *_: None, subnet_into(found)
            )
            waits: list[asyncio.Future[Any]] = [found, stream.done]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stream.close()
            if found.done():
                self.subnet = found.result()
                break
        network = {"fieldSelector": "metadata.name=default"}
        await self.expect("GET", collection_path(CLUSTER_NETWORK), None, 200, params=network)
        return self.subnet

    async def set_ready(self) -> None:
        path = f"{collection_path(NODE)}/{self.spec.name}"
        for _ in range(10):  # a conflict means the master wrote meanwhile: read again
            node = await self.expect("GET", path, None, 200)
            status = dict(node.get("status") or {})
            others = [c for c in status.get("conditions") or [] if c.get("type") != "Ready"]
            status["conditions"] = [*others, ready_condition()]
            code, _ = await self.call("PUT", f"{path}/status", {**node, "status": status})
            if code == 200:
                return
        raise Failed(f"node {self.spec.name}: Ready condition not written")

    # ---- watches --------------------------------------------------------------------

    async def list_version(self, kind: Kind) -> int:
        """List ``kind`` as the reflector does (the whole list is read) and return its
        resourceVersion (read from the list's head, not by decoding every item)."""
        async with self.session().get(collection_path(kind)) as answer:
            body = await answer.read()
            if answer.status != 200:
                raise Failed(f"list {kind.plural}: {answer.status}")
        found = VERSION.search(body, 0, 512)
        if found is None:
            raise Failed(f"list {kind.plural}: no resourceVersion")
        return int(found.group(1))

    async def watch(self, plural: str, since: int, opened: asyncio.Event) -> None:
        """Watch ``plural`` from ``since`` (0: list first) until cancelled."""
        kind = kind_named(plural)
        self.versions[plural] = since
        self.counts.setdefault(plural, 0)
        expired = False

        def sink(type_: bytes, version: int, code: int) -> None:
            nonlocal expired
            if type_ == b"ERROR":
                expired = expired or code == 410
                self.tally.expired += code == 410
                self.tally.error(f"watch ERROR {code}")
                return
            if version:
                self.versions[plural] = version
            if type_ == b"BOOKMARK":
                return
            self.counts[plural] += 1
            if plural == "pods":
                self.tally.seen(version, self.spec.name)

        delay = RETRY[0]
        while True:
            if not self.versions[plural] or expired:
                self.versions[plural] = await self.list_version(kind)
                expired = False
            query = {
                "watch": "true",
                "resourceVersion": str(self.versions[plural]),
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(random.randint(*WATCH_SECONDS)),
            }
            try:
                stream = await open_watch(
                    self.endpoint, collection_path(kind), query, self.spec.token, sink
                )
            except OSError as exc:
                self.tally.error(f"watch {type(exc).__name__}")
                stream = None
            if stream is not None and stream.status == 200:
                opened.set()
                self.opened.setdefault(plural, []).append(time.monotonic())
                self._streams.add(stream)
                try:
                    await stream.done
                finally:
                    self._streams.discard(stream)
                    stream.close()
                self.tally.reconnects += 1
                if stream.broken:
                    self.tally.error("watch body not chunked")
                if stream.events or expired:
                    delay = RETRY[0]
                    continue
                self.tally.error("watch ended without an event")
            elif stream is not None:
                expired = stream.status == 410
                self.tally.expired += expired
                self.tally.error(f"watch {stream.status}")
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, RETRY[1])

    async def close(self) -> None:
        for stream in list(self._streams):
            stream.close()
        if self._session is not None:
            await self._session.close()
