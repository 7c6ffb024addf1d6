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

Issue 19: the runtime also orphans sandboxes, the way users do: it force-deletes a live
sandbox's Pod object (grace 0), or deletes a whole namespace holding one, and leaves the
sandbox running, wired and serving, until the checks have shown that nothing reaches it
and it reaches nothing (``orphans``); then it DELs it, as a runtime finally would.

``Churn`` drives ADDs and DELs on every node from background threads, bounded in count and
time. ``podnet.testing.chaoskill`` crashes and revives the agent, the master or etcd;
``podnet.testing.chaoscheck`` holds the invariants.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import secrets
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podnet import netns
from podnet.cluster.pods import admin_api, ensure_namespace
from podnet.testing.cniexec import CNI_TIMEOUT, IFNAME, CniAnswer, run_cni
from podnet.testing.e2e import load_state
from podnet.testing.echoservers import EchoServers

if TYPE_CHECKING:
    from podnet.client.sync import ApiClient

OP_PAUSE = 0.1  # between one churn thread's operations: keeps two cores breathing
ORPHAN_GRACE = 1  # seconds: the chaos pods' terminationGracePeriodSeconds


@dataclass
class Sandbox:
    """One pod sandbox the runtime made: its Pod name, node, namespace and address."""

    name: str
    node: str
    netns: str
    container_id: str
    ip: str = ""
    has_object: bool = False  # its Pod object was created before the ADD
    namespace: str = ""  # its Pod's namespace


@dataclass
class Runtime:
    """The runtime of every node of the cluster at ``state_dir`` (thread-safe)."""

    state_dir: Path
    pod_namespace: str = "chaos"
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    live: dict[str, Sandbox] = field(default_factory=dict)  # by container ID
    pending_del: dict[str, Sandbox] = field(default_factory=dict)
    pending_pod_deletes: set[str] = field(default_factory=set)
    orphans: dict[str, Sandbox] = field(default_factory=dict)  # object gone, sandbox running
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
        args = f"K8S_POD_NAMESPACE={sandbox.namespace};K8S_POD_NAME={sandbox.name}"
        path = netns.path(sandbox.netns)
        return {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": sandbox.container_id,
            "CNI_NETNS": str(path) if path.exists() else "",
            "CNI_ARGS": f"IgnoreUnknown=1;{args}",
        }

    def add(self, node: str, namespace: str | None = None) -> Sandbox | None:
        """Create a sandbox on ``node`` and ADD it; on failure DEL it (the CNI contract)."""
        seq = next(self._seq)
        name = f"chaos-{self.tag}-{seq}"
        sandbox = Sandbox(name, node, f"{self.prefix}-c{self.tag}-{seq}", secrets.token_hex(32))
        sandbox.namespace = namespace or self.pod_namespace
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
            "metadata": {"name": sandbox.name, "namespace": sandbox.namespace},
            "spec": {
                "nodeName": sandbox.node,
                "containers": [{"name": "main", "image": "x"}],
                "terminationGracePeriodSeconds": ORPHAN_GRACE,
            },
        }
        try:
            with quick_api(self.state_dir) as api:
                api.create(POD, obj, namespace=sandbox.namespace)
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

    def orphan(self, sandbox: Sandbox) -> bool:
        """Force-delete ``sandbox``'s Pod object (grace 0, as ``kubectl delete --force
        --grace-period=0``) and keep the sandbox running: an orphan. False (and still
        live) when the API does not take the delete."""
        from podnet.client import ClientError
        from podnet.model.kinds import POD

        try:
            with quick_api(self.state_dir) as api:
                api.delete(POD, sandbox.namespace, sandbox.name, grace_period_seconds=0)
        except (ClientError, OSError):
            self._count("orphaning refused (API down)")
            return False
        self._make_orphan(sandbox)
        return True

    def orphan_by_namespace(self, node: str, api: Any, timeout: float = 60.0) -> str:
        """ADD a sandbox in a namespace of its own, delete the namespace and wait until
        its Pod object is gone (the namespace controller deletes it, gracefully; the node
        finishes it when the grace runs out); the sandbox then runs on as an orphan.
        Returns a problem, or ""."""
        from podnet.model.kinds import NAMESPACE, POD

        namespace = f"chaos-{self.tag}-ns{next(self._seq)}"
        ensure_namespace(api, namespace)
        sandbox = self.add(node, namespace)
        if sandbox is None:
            return f"ADD in namespace {namespace} failed"
        with self.lock:
            self.live.pop(sandbox.container_id, None)
        api.delete(NAMESPACE, None, namespace)
        deadline = time.monotonic() + timeout
        while api.list(POD, namespace=namespace)["items"]:
            if time.monotonic() > deadline:
                self._make_orphan(sandbox)
                return f"the Pod of deleted namespace {namespace} is still there after {timeout}s"
            time.sleep(0.05)
        self._make_orphan(sandbox)
        return ""

    def _make_orphan(self, sandbox: Sandbox) -> None:
        with self.lock:
            self.live.pop(sandbox.container_id, None)
            self.orphans[sandbox.container_id] = sandbox
        self._count("orphaned")

    def release_orphans(self) -> list[str]:
        """DEL every orphan (it must succeed: the node may have detached it already) and
        remove its namespace; what failed, as messages."""
        with self.lock:
            orphans = list(self.orphans.values())
            self.orphans.clear()
        problems = []
        for sandbox in orphans:
            self.echo.stop(sandbox.container_id)
            answer = run_cni(self.state_dir, sandbox.node, self._env(sandbox, "DEL"))
            if not answer.ok:
                problems.append(f"DEL of orphan {sandbox.name} failed: {answer.text.strip()}")
                with self.lock:
                    self.pending_del[sandbox.container_id] = sandbox
                continue
            netns.remove(sandbox.netns)
        return problems

    def retry_deletes(self) -> list[str]:
        """DEL every sandbox whose DEL failed, all at once (a runtime retries each of its
        containers on its own); what still fails, as messages."""
        with self.lock:
            pending = list(self.pending_del.values())
        if not pending:
            return []
        with ThreadPoolExecutor(len(pending)) as pool:
            done = list(pool.map(self.delete, pending))
        return [
            f"DEL of {s.name} on {s.node} fails again"
            for s, ok in zip(pending, done, strict=True)
            if not ok
        ]

    def delete_pod_objects(self, api: Any) -> None:
        """Delete the Pod objects of deleted sandboxes (as a kubelet finalizes a pod)."""
        from podnet.client import StatusError
        from podnet.model.kinds import POD

        with self.lock:
            names = sorted(self.pending_pod_deletes)
        for name in names:
            try:
                api.delete(POD, self.pod_namespace, name, grace_period_seconds=0)
            except StatusError as exc:
                if exc.code != 404:
                    continue
            with self.lock:
                self.pending_pod_deletes.discard(name)

    def gc(self, node: str) -> CniAnswer:
        """A CNI GC on ``node`` listing every live attachment there."""
        with self.lock:  # an orphan's sandbox still runs: the runtime still lists it
            orphans = [s for s in self.orphans.values() if s.node == node]
        held = self.live_on(node) + orphans
        valid = [{"containerID": s.container_id, "ifname": IFNAME} for s in held]
        extra = {"cniVersion": "1.1.0", "cni.dev/valid-attachments": valid}
        return run_cni(self.state_dir, node, {"CNI_COMMAND": "GC"}, extra)

    def close(self) -> None:
        """DEL every sandbox (best effort), stop the echo loop, remove every namespace
        this runtime made, by exact name."""
        held = [*self.snapshot(), *self.pending_del.values(), *self.orphans.values()]
        for sandbox in held:
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
