"""The router benchmarks' lab: a local cluster started with ``--router`` in a throwaway
state directory (removed at the end, also on failure), httpecho backends, Routes, the
router's metrics (read on its pod's loopback) and the memory of its processes.

Clients run on the external host (``ip netns exec``), where route hosts resolve to the
router through the apps domain. ``direct_route`` gives the external host a /32 route to
one pod through its node (inside the external host's namespace, which the cluster
removes), so the same client can measure the pod without the router.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podnet import netns
from podnet.cluster import lifecycle, pods
from podnet.cluster.readiness import ReadinessCheck
from podnet.cluster.router import METRICS_PORT
from podnet.cluster.routerprocs import pids_in_netns
from podnet.cluster.state import ClusterState, PodRecord
from podnet.cluster.underlay import external_netns
from podnet.model.kinds import POD, ROUTE, SERVICE
from podnet.testing import routerclient as rc
from podnet.testing.e2e import load_state, wait_for

DOMAIN = "apps.podnet.test"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def host(name: str) -> str:
    return f"{name}.{DOMAIN}"


def quiet(_line: str) -> None:
    pass


def machine_load() -> str:
    """The 1-minute load average and the CPU count, to quote with the figures."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (5 min {five:.2f}) on {os.cpu_count()} CPUs"


@dataclass
class Lab:
    """One cluster with the router."""

    state_dir: Path

    @property
    def state(self) -> ClusterState:
        return load_state(self.state_dir)

    @property
    def ext(self) -> str:
        return external_netns(self.state)

    @property
    def router_pod(self) -> PodRecord:
        state = self.state
        assert state.router is not None
        return state.pods[state.router.pod]

    @property
    def router_address(self) -> str:
        state = self.state
        assert state.router is not None
        return state.router.address

    def backend(
        self, name: str, app: str, namespace: str = "default", tls: bool = False
    ) -> PodRecord:
        """An httpecho pod (HTTP 8080; HTTPS 8443 with its own CA when ``tls``), Ready
        once it accepts connections (its readiness check), as a rollout's new pod is."""
        command = [*rc.HTTPECHO, "--name", name, "--port", "8080"]
        ports: list[pods.ContainerPort] = [("http", 8080, "TCP")]
        if tls:
            command += ["--tls-port", "8443", "--self-signed", f"{app}.{namespace}.svc,{host(app)}"]
            ports.append(("https", 8443, "TCP"))
        ready = ReadinessCheck(8443 if tls else 8080, period=0.2, timeout=0.2, failures=1)
        pod = pods.run_pod(
            self.state_dir,
            name,
            namespace,
            "node1",
            {"app": app},
            tuple(command),
            ports,
            readiness=ready,
        )
        for _, port, _ in ports:
            pods.wait_listening(pod, port)
        wait_for(lambda: self.ready(name, namespace), 60, f"pod {name} Ready")
        return pod

    def ready(self, name: str, namespace: str = "default") -> bool:
        """Whether the Pod's Ready condition is True."""
        with pods.admin_api(self.state_dir) as api:
            status = api.get(POD, namespace, name).get("status") or {}
        conditions = status.get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def create(self, kind: Any, obj: dict[str, Any], namespace: str = "default") -> None:
        with pods.admin_api(self.state_dir) as api:
            api.create(kind, obj, namespace=namespace)

    def service(self, app: str, tls: bool = False, namespace: str = "default") -> None:
        self.create(SERVICE, rc.service(app, {"app": app}, tls=tls), namespace)

    def route(self, obj: dict[str, Any], namespace: str = "default") -> None:
        self.create(ROUTE, obj, namespace)

    def served(self, url: str, timeout: float = 60.0) -> None:
        """Until the router answers 200 for ``url`` (-k: any certificate)."""
        wait_for(lambda: rc.curl(self.state, url, "-k").code == 200, timeout, f"{url} served")

    def in_ext(
        self, argv: Sequence[str], timeout: float = 600.0
    ) -> subprocess.CompletedProcess[str]:
        return rc.in_external(self.state, argv, timeout)

    @contextlib.contextmanager
    def direct_route(self, pod: PodRecord) -> Iterator[str]:
        """A route on the external host to ``pod``'s IP through its node; its IP."""
        node = self.state.nodes[pod.node].ip
        netns.run(self.ext, ["ip", "route", "replace", f"{pod.ip}/32", "via", node], check=True)
        try:
            yield pod.ip
        finally:
            netns.run(self.ext, ["ip", "route", "del", f"{pod.ip}/32"])

    def metrics(self) -> dict[str, float]:
        """The router's metrics, each name summed over its label sets."""
        url = f"http://127.0.0.1:{METRICS_PORT}/metrics"
        # Each scrape reads HAProxy's stats: slow with 10,000 backends on a loaded machine.
        argv = ["curl", "-sS", "-m", "120", url]
        text = netns.run(self.router_pod.netns, argv, timeout=150, check=True).stdout
        out: dict[str, float] = {}
        for line in text.splitlines():
            if (match := _SAMPLE.match(line)) and not line.startswith("#"):
                out[match.group(1)] = out.get(match.group(1), 0.0) + float(match.group(3))
        return out

    def reloads(self) -> int:
        return int(self.metrics().get("podnet_router_reloads_total", 0))

    def rss_kib(self) -> dict[str, int]:
        """Resident memory (KiB) of the router process and of HAProxy (all its
        processes in the router pod's namespace, master and workers summed)."""
        router = self.router_pod
        pid = router.process.pid if router.process else 0
        out = {"router": _rss(pid), "haproxy": 0}
        for other in pids_in_netns(router.netns):
            if other != pid and "haproxy" in _comm(other):
                out["haproxy"] += _rss(other)
        return out


def _rss(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@contextlib.contextmanager
def router_cluster(nodes: int = 1, plugin: str = "subnet") -> Iterator[Lab]:
    """A cluster with the router, torn down at the end (also on failure)."""
    state_dir = Path(tempfile.mkdtemp(prefix="pn-rbench-"))
    dataplane = os.environ.get("PODNET_TEST_DATAPLANE", "linux")
    spec = lifecycle.ClusterSpec(nodes=nodes, plugin=plugin, router=True, dataplane=dataplane)
    started = time.monotonic()
    try:
        lifecycle.cluster_up(state_dir, spec, say=quiet)
        print(f"cluster with router up in {time.monotonic() - started:.0f} s; {machine_load()}")
        yield Lab(state_dir)
    finally:
        lifecycle.cluster_down(state_dir, say=quiet)
        shutil.rmtree(state_dir, ignore_errors=True)
