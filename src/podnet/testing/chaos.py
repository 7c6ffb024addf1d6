"""Chaos on the local cluster: a small CNI runtime and pod ADD/DEL churn, for issue 8's
chaos test (SIGKILL of an agent, the master or etcd during the churn).

``Runtime`` plays the container runtime of every node: a sandbox is a fresh network
namespace, wired by the node's installed CNI executable (the real shim, run inside the
node namespace with the runtime's environment). The CNI contract is kept: a failed ADD is
followed by a DEL, a DEL that fails is retried until it succeeds, and a GC lists every
attachment the runtime still holds. Each live sandbox serves TCP echo on port 8080 from a
socket opened inside its namespace by this process (``EchoServers``), so reachability is
probed without a process per pod. Before an ADD the runtime creates the sandbox's Pod
object, bound to its node, as the scheduler would; while the API is down it ADDs without
one, as podman does. The agent writes the Pod's IP; after a successful DEL the runtime
deletes the Pod object, as a kubelet finalizes a pod.

``Churn`` drives ADDs and DELs on every node from background threads, bounded in count and
time. ``podnet.testing.chaoskill`` crashes and revives the agent, the master or etcd;
``podnet.testing.chaoscheck`` holds the invariants.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import secrets
import socket
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podnet import netns
from podnet.cluster import nodes
from podnet.cluster.pods import admin_api, ensure_namespace
from podnet.testing.e2e import load_state

if TYPE_CHECKING:
    from podnet.client.sync import ApiClient

ECHO_PORT = 8080
IFNAME = "eth0"
CNI_TIMEOUT = 60.0
OP_PAUSE = 0.1  # between one churn thread's operations: keeps two cores breathing


@dataclass
class Sandbox:
    """One pod sandbox the runtime made: its Pod name, node, namespace and address."""

    name: str
    node: str
    netns: str
    container_id: str
    ip: str = ""
    has_object: bool = False  # its Pod object was created before the ADD


@dataclass(frozen=True)
class CniAnswer:
    """What the CNI executable said: exit code, and its JSON (``{}`` if none)."""

    returncode: int
    body: dict[str, Any]
    text: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def code(self) -> int:
        """The CNI error code (0 on success, -1 if the output was no error JSON)."""
        return 0 if self.ok else int(self.body.get("code", -1))


def run_cni(
    state_dir: Path, node: str, env: dict[str, str], extra: dict[str, Any] | None = None
) -> CniAnswer:
    """Run ``node``'s installed CNI executable inside the node namespace, as its runtime
    would: the podnet plugin's conflist entry (plus ``extra``) on stdin."""
    paths = nodes.node_paths(state_dir, node)
    conflist = json.loads(paths.conflist.read_text())
    plugin = next(p for p in conflist["plugins"] if p.get("type") == "podnet")
    config = {"cniVersion": conflist["cniVersion"], "name": conflist["name"], **plugin}
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "CNI_PATH": f"{paths.cni_bin_dir}:/usr/lib/cni",
        "CNI_IFNAME": IFNAME,
        **env,
    }
    argv = netns.command(load_state(state_dir).nodes[node].netns, [str(paths.shim)])
    try:
        done = subprocess.run(
            argv,
            input=json.dumps({**config, **(extra or {})}),
            env=full_env,
            capture_output=True,
            text=True,
            timeout=CNI_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return CniAnswer(-9, {"msg": f"no answer in {CNI_TIMEOUT}s"}, "")
    try:
        body = json.loads(done.stdout) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        body = {}
    return CniAnswer(done.returncode, body if isinstance(body, dict) else {}, done.stdout)


class EchoServers:
    """TCP echo on port 8080 inside each live sandbox, served by one event loop thread.

    The listening socket is created inside the sandbox's namespace (a socket stays in
    the namespace it was made in). ``stop`` closes it and every accepted connection, so
    nothing of ours pins a namespace that is about to be removed."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: dict[str, asyncio.Server] = {}
        self.conns: dict[str, set[asyncio.StreamWriter]] = {}

    def start(self, key: str, namespace: str) -> None:
        """Serve echo in ``namespace`` under ``key``."""
        with netns.entered(namespace):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", ECHO_PORT))
        sock.listen(64)
        sock.setblocking(False)
        conns: set[asyncio.StreamWriter] = set()

        async def serve() -> asyncio.Server:
            return await asyncio.start_server(self._handler(conns), sock=sock)

        server = asyncio.run_coroutine_threadsafe(serve(), self.loop).result(10)
        self.servers[key], self.conns[key] = server, conns

    def _handler(self, conns: set[asyncio.StreamWriter]) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conns.add(writer)
            try:
                while data := await asyncio.wait_for(reader.read(4096), 10):
                    writer.write(data)
                    await writer.drain()
            except (OSError, TimeoutError):
                pass
            finally:
                conns.discard(writer)
                writer.close()

        return handle

    def stop(self, key: str) -> None:
        """Close ``key``'s listener and connections (no-op if unknown)."""
        server, conns = self.servers.pop(key, None), self.conns.pop(key, set())
        if server is None:
            return

        async def close() -> None:
            server.close()
            for writer in list(conns):
                writer.transport.abort()
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)

    def close(self) -> None:
        """Stop every server and the loop."""
        for key in list(self.servers):
            self.stop(key)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclass
class Runtime:
    """The runtime of every node of the cluster at ``state_dir`` (thread-safe)."""

    state_dir: Path
    pod_namespace: str = "chaos"
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    live: dict[str, Sandbox] = field(default_factory=dict)  # by container ID
    pending_del: dict[str, Sandbox] = field(default_factory=dict)
    pending_pod_deletes: set[str] = field(default_factory=set)
    made: list[str] = field(default_factory=list)  # every sandbox namespace, for cleanup
    stats: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.prefix = load_state(self.state_dir).prefix()
        self.lock = threading.Lock()
        self.echo = EchoServers()
        self._seq = itertools.count(1)
        with admin_api(self.state_dir) as api:
            ensure_namespace(api, self.pod_namespace)

    def live_on(self, node: str) -> list[Sandbox]:
        """The live sandboxes of ``node``, oldest first."""
        with self.lock:
            return [s for s in self.live.values() if s.node == node]

    def snapshot(self) -> list[Sandbox]:
        """Every live sandbox."""
        with self.lock:
            return list(self.live.values())

    def _env(self, sandbox: Sandbox, command: str) -> dict[str, str]:
        args = f"K8S_POD_NAMESPACE={self.pod_namespace};K8S_POD_NAME={sandbox.name}"
        path = netns.path(sandbox.netns)
        return {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": sandbox.container_id,
            "CNI_NETNS": str(path) if path.exists() else "",
            "CNI_ARGS": f"IgnoreUnknown=1;{args}",
        }

    def add(self, node: str) -> Sandbox | None:
        """Create a sandbox on ``node`` and ADD it; on failure DEL it (the CNI contract)."""
        seq = next(self._seq)
        name = f"chaos-{self.tag}-{seq}"
        sandbox = Sandbox(name, node, f"{self.prefix}-c{self.tag}-{seq}", secrets.token_hex(32))
        sandbox.has_object = self._create_pod_object(sandbox)
        with self.lock:
            self.made.append(sandbox.netns)
        netns.create(sandbox.netns)
        answer = run_cni(self.state_dir, node, self._env(sandbox, "ADD"))
        if not answer.ok:
            self._count(f"ADD failed (code {answer.code})")
            self.delete(sandbox)
            return None
        sandbox.ip = str(answer.body["ips"][0]["address"]).split("/")[0]
        self.echo.start(sandbox.container_id, sandbox.netns)
        with self.lock:
            self.live[sandbox.container_id] = sandbox
        self._count("ADD ok")
        return sandbox

    def _create_pod_object(self, sandbox: Sandbox) -> bool:
        """Create the sandbox's Pod, bound to its node; False if the API is down."""
        from podnet.client import ClientError
        from podnet.model.kinds import POD

        obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": sandbox.name, "namespace": self.pod_namespace},
            "spec": {"nodeName": sandbox.node, "containers": [{"name": "main", "image": "x"}]},
        }
        try:
            with quick_api(self.state_dir) as api:
                api.create(POD, obj, namespace=self.pod_namespace)
        except (ClientError, OSError):
            self._count("Pod object not created (API down)")
            return False
        return True

    def delete(self, sandbox: Sandbox) -> bool:
        """Stop the sandbox's echo, DEL it, remove its namespace; a failed DEL is kept
        for ``retry_deletes`` (the sandbox is then no longer live)."""
        with self.lock:
            self.live.pop(sandbox.container_id, None)
        self.echo.stop(sandbox.container_id)
        answer = run_cni(self.state_dir, sandbox.node, self._env(sandbox, "DEL"))
        if not answer.ok:
            self._count(f"DEL failed (code {answer.code})")
            with self.lock:
                self.pending_del[sandbox.container_id] = sandbox
            return False
        netns.remove(sandbox.netns)
        with self.lock:
            self.pending_del.pop(sandbox.container_id, None)
            self.pending_pod_deletes.add(sandbox.name)
        self._count("DEL ok")
        return True

    def retry_deletes(self) -> list[str]:
        """DEL every sandbox whose DEL failed; what still fails, as messages."""
        with self.lock:
            pending = list(self.pending_del.values())
        return [f"DEL of {s.name} on {s.node} fails again" for s in pending if not self.delete(s)]

    def delete_pod_objects(self, api: Any) -> None:
        """Delete the Pod objects of deleted sandboxes (as a kubelet finalizes a pod)."""
        from podnet.client import StatusError
        from podnet.model.kinds import POD

        with self.lock:
            names = sorted(self.pending_pod_deletes)
        for name in names:
            try:
                api.delete(POD, self.pod_namespace, name)
            except StatusError as exc:
                if exc.code != 404:
                    continue
            with self.lock:
                self.pending_pod_deletes.discard(name)

    def gc(self, node: str) -> CniAnswer:
        """A CNI GC on ``node`` listing every live attachment there."""
        valid = [{"containerID": s.container_id, "ifname": IFNAME} for s in self.live_on(node)]
        extra = {"cniVersion": "1.1.0", "cni.dev/valid-attachments": valid}
        return run_cni(self.state_dir, node, {"CNI_COMMAND": "GC"}, extra)

    def close(self) -> None:
        """DEL every sandbox (best effort), stop the echo loop, remove every namespace
        this runtime made, by exact name."""
        for sandbox in self.snapshot() + list(self.pending_del.values()):
            with contextlib.suppress(Exception):
                self.delete(sandbox)
        self.echo.close()
        for name in self.made:
            netns.remove(name)

    def _count(self, what: str) -> None:
        with self.lock:
            self.stats[what] += 1


def quick_api(state_dir: Path) -> ApiClient:
    """An admin API client that gives up within seconds (the master may be down)."""
    import httpx

    from podnet.client.sync import ApiClient
    from podnet.kubeconfig import load_client_config

    config = load_client_config(str(state_dir / "master" / "admin.kubeconfig"))
    return ApiClient(config, timeout=httpx.Timeout(3.0, connect=1.0))


class Churn:
    """ADDs and DELs on every node from one thread per node until ``stop`` (or
    ``max_ops`` per thread, or ``max_seconds``), keeping ``low``..``high`` live
    sandboxes per node."""

    def __init__(
        self,
        runtime: Runtime,
        node_names: list[str],
        rng: random.Random,
        low: int = 2,
        high: int = 3,
        max_ops: int = 200,
        max_seconds: float = 120.0,
    ) -> None:
        self.runtime, self.low, self.high = runtime, low, high
        self.max_ops, self.max_seconds = max_ops, max_seconds
        self.halt = threading.Event()
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._run, args=(n, random.Random(rng.random())), daemon=True)
            for n in node_names
        ]

    def __enter__(self) -> Churn:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Ask the threads to end after their current operation, and wait for them."""
        self.halt.set()
        for thread in self.threads:
            thread.join(CNI_TIMEOUT * 3)
            if thread.is_alive():
                self.errors.append(f"churn thread {thread.name} did not stop")

    def _run(self, node: str, rng: random.Random) -> None:
        deadline = time.monotonic() + self.max_seconds
        for _ in range(self.max_ops):
            if self.halt.is_set() or time.monotonic() > deadline:
                return
            try:
                self._step(node, rng)
            except Exception as exc:  # a test-side failure: reported, never swallowed
                self.errors.append(f"churn on {node}: {exc!r}")
                return
            self.halt.wait(OP_PAUSE)

    def _step(self, node: str, rng: random.Random) -> None:
        live = self.runtime.live_on(node)
        grow = len(live) < self.low or (len(live) < self.high and rng.random() < 0.5)
        if grow:
            self.runtime.add(node)
        else:
            self.runtime.delete(rng.choice(live))
