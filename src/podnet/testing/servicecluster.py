"""A real local cluster as the Service e2e tests use it: "who am I" pods, Services,
clients that count who answered (``podnet.testing.servicelab``'s client, a bounded loop
of connections from a pod's sandbox, a node or the external host), waits on the traffic
itself, and the service table as the kernel lists it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podnet import netns
from podnet.cluster import pods
from podnet.cluster.state import ClusterState, PodRecord
from podnet.cluster.underlay import tcp_listens
from podnet.model.kinds import SERVICE
from podnet.testing.e2e import wait_for
from podnet.testing.servicelab import CLIENT, WHOAMI, Result

PORT = 8080
SETTLE = 30.0  # bound on waiting for a change to show in traffic
TABLE = ["nft", "-j", "list", "table", "ip", "podnet_services"]


@dataclass
class Cluster:
    """The cluster at ``state_dir``; pods and Services in ``namespace``."""

    state_dir: Path
    namespace: str

    def state(self) -> ClusterState:
        state = ClusterState.load(self.state_dir)
        assert state is not None
        return state

    def api(self) -> Any:
        return pods.admin_api(self.state_dir)

    def node_ip(self, k: int) -> str:
        return self.state().nodes[f"node{k}"].ip

    def node_ns(self, k: int) -> str:
        return self.state().nodes[f"node{k}"].netns

    def external(self) -> tuple[str, str]:
        """The external host's namespace and address."""
        external = self.state().external
        assert external is not None
        return external.netns, external.ip

    def pod(self, name: str) -> PodRecord:
        return pods.find_pod(self.state(), name, self.namespace)

    def whoami(
        self, name: str, node: int, labels: dict[str, str], port: int = PORT, **kw: Any
    ) -> PodRecord:
        """A pod answering ``<name> <peer>`` on TCP/UDP ``port``, once it listens."""
        command = (sys.executable, "-c", WHOAMI, name, str(port), "3600")
        pods.run_pod(
            self.state_dir, name, self.namespace, f"node{node}", labels, command=command, **kw
        )
        record = self.pod(name)
        wait_for(lambda: tcp_listens(record.netns, port), 15, f"{name} listening on {port}")
        return record

    def service(self, name: str, selector: dict[str, str] | None, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "ports": [{"port": 80, "targetPort": PORT, "protocol": "TCP"}],
                **({"selector": selector} if selector is not None else {}),
                **spec,
            },
        }
        with self.api() as api:
            return dict(api.create(SERVICE, body, namespace=self.namespace))

    def from_pod(self, pod: str, ip: str, port: int = 80, count: int = 1) -> Result:
        """``count`` connections from inside ``pod`` (its sandbox, as its user)."""
        argv = [sys.executable, "-c", CLIENT, ip, str(port), str(count), "tcp", "0"]
        done = pods.exec_pod(self.state_dir, pod, argv, self.namespace, timeout=300)
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        return Result(found["answers"], found["errors"])

    def from_netns(self, namespace: str, ip: str, port: int, count: int = 1) -> Result:
        """``count`` connections from a node or the external host."""
        argv = [sys.executable, "-c", CLIENT, ip, str(port), str(count), "tcp", "0"]
        done = netns.run(namespace, argv, timeout=300)
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        return Result(found["answers"], found["errors"])


@contextlib.contextmanager
def extra_pods(cluster: Cluster) -> Iterator[list[str]]:
    """Names appended to the list are deleted at the end, whatever happened."""
    made: list[str] = []
    try:
        yield made
    finally:
        for name in made:
            if f"{cluster.namespace}/{name}" in cluster.state().pods:
                pods.delete_pod(cluster.state_dir, name, cluster.namespace)


def answers_from(cluster: Cluster, client: str, ip: str, expected: set[str], count: int) -> Result:
    """Wait until ``count`` connections from ``client`` are all answered, exactly by
    ``expected``; return that last round."""

    def round_() -> Result | None:
        result = cluster.from_pod(client, ip, count=count)
        return result if not result.errors and set(result.by_pod()) == expected else None

    found: Result = wait_for(round_, SETTLE, f"{client} -> {ip}: answers from {sorted(expected)}")
    return found


@contextlib.contextmanager
def listening(pod: PodRecord, port: int) -> Iterator[None]:
    """A TCP listener on ``port`` in the pod's namespace (its readiness), stopped by PID."""
    argv = [sys.executable, "-m", "podnet.cluster.echo", "--port", str(port)]
    process = subprocess.Popen(netns.command(pod.netns, argv), start_new_session=True)
    try:
        wait_for(lambda: tcp_listens(pod.netns, port), 15, f"listener on {port}")
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def nft_table(namespace: str) -> list[str]:
    """The service table as the kernel lists it (handles included), one item a line;
    without the countdown of session affinity entries (``expires``), which is time."""
    items = json.loads(netns.run(namespace, TABLE, check=True).stdout)["nftables"]
    return [json.dumps(without_expiry(item), sort_keys=True) for item in items]


def without_expiry(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_expiry(v) for k, v in value.items() if k != "expires"}
    if isinstance(value, list):
        return [without_expiry(v) for v in value]
    return value


def table_changes(before: list[str], after: list[str]) -> str:
    gone = [item for item in before if item not in after]
    new = [item for item in after if item not in before]
    return "" if before == after else f"gone: {gone}\nnew: {new}\n(or reordered)"
