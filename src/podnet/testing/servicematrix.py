"""Isolation through cluster IPs on a real local cluster: one Service in front of each
pod, every pod probed through every other pod's Service, and ``podnet trace`` asked for
the same pairs, so a test compares traffic, trace and its expectation.

Each pod ``ns/name`` runs the echo server on 8080 with label ``app=<name>``; its Service
``to-<name>`` maps port 80 to 8080. A probe is one TCP echo from inside the source pod
(``podnet.cluster.matrix.tcp_probe``, bounded by its timeout), a few at a time; the
trace is ``podnet trace``'s own code, run in process on one read of the objects.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from podnet.cli.trace_service import service_trace
from podnet.cluster import lifecycle, pods
from podnet.cluster.matrix import Endpoint, tcp_probe
from podnet.cluster.state import ClusterState
from podnet.model.kinds import SERVICE
from podnet.policy.servicetrace import expected_reach
from podnet.policy.trace import fetch_objects
from podnet.testing import planeview
from podnet.testing.e2e import TEST_DATAPLANE, cluster_down_with_logs, wait_for

PORT = 80
TARGET = 8080
WORKERS = 6
Pair = tuple[str, str]


def service_name(key: str) -> str:
    return f"to-{key.split('/')[1]}"


def run_pods(state_dir: Path, keys: Sequence[str], nodes: int) -> None:
    """Pod ``i`` of ``keys`` on node ``i mod nodes + 1``, with its Service in front."""
    with pods.admin_api(state_dir) as api:
        for i, key in enumerate(keys):
            ns, name = key.split("/")
            pods.run_pod(state_dir, name, ns, f"node{i % nodes + 1}", {"app": name})
            body = {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": service_name(key), "namespace": ns},
                "spec": {
                    "selector": {"app": name},
                    "ports": [{"port": PORT, "targetPort": TARGET}],
                },
            }
            api.create(SERVICE, body, namespace=ns)


@contextlib.contextmanager
def matrix_cluster(
    state_dir: Path, plugin: str, keys: Sequence[str], node_count: int
) -> Iterator[Path]:
    """A local cluster of ``node_count`` nodes with ``plugin`` in ``state_dir``, the pods
    ``keys`` and their Services (``run_pods``); on exit, even when a test failed, each
    agent log's tail is printed (shown for a failed test) and the cluster is torn down."""
    try:
        spec = lifecycle.ClusterSpec(nodes=node_count, plugin=plugin, dataplane=TEST_DATAPLANE)
        lifecycle.cluster_up(state_dir, spec, say=print)
        run_pods(state_dir, keys, node_count)
        yield state_dir
    finally:
        cluster_down_with_logs(state_dir)


def cluster_ips(state_dir: Path, keys: Sequence[str]) -> dict[str, str]:
    """Each pod's Service's cluster IP."""
    with pods.admin_api(state_dir) as api:
        found = {}
        for key in keys:
            ns = key.split("/")[0]
            found[key] = str(api.get(SERVICE, ns, service_name(key))["spec"]["clusterIP"])
        return found


def pairs(keys: Sequence[str]) -> list[Pair]:
    return [(s, d) for s in keys for d in keys if s != d]


def traffic(state_dir: Path, keys: Sequence[str]) -> dict[Pair, bool]:
    """Whether each source's TCP echo through each destination's cluster IP came back."""
    state = ClusterState.load(state_dir)
    assert state is not None
    ips = cluster_ips(state_dir, keys)

    def reach(pair: Pair) -> bool:
        src = state.pods[pair[0]]
        source = Endpoint(src.key, src.node, src.ip, src.netns)
        return tcp_probe(source, ips[pair[1]], PORT).ok

    wanted = pairs(keys)
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return dict(zip(wanted, pool.map(reach, wanted), strict=True))


def traced(state_dir: Path, keys: Sequence[str]) -> dict[Pair, bool]:
    """What ``podnet trace SRC svc/NS/to-NAME --port 80`` decides for each pair (its own
    code, in process): every ready endpoint allows it, or none does (mixed fails)."""
    with pods.admin_api(state_dir) as api:
        objects = fetch_objects(api)
        found = {}
        for src, dst in pairs(keys):
            target = f"svc/{dst.split('/')[0]}/{service_name(dst)}"
            traced_route = service_trace(api, objects, [src, target], ("TCP", PORT))
            assert traced_route is not None, f"trace {src} {target}: not a Service"
            reach = expected_reach(traced_route[2])
            assert reach is not None, f"trace {src} {target}: mixed verdicts"
            found[(src, dst)] = reach
        return found


def render(keys: Sequence[str], verdicts: dict[Pair, bool]) -> str:
    """Rows of 1/0 per destination (a pod reaches itself: 1), one per source."""
    return "\n".join(
        f"{s} " + "".join("1" if s == d or verdicts[(s, d)] else "0" for d in keys) for s in keys
    )


def matrix_becomes(state_dir: Path, keys: Sequence[str], expected: str, timeout: float) -> None:
    """Once every node's policy table holds what the API's objects compile to, wait
    (bounded) until the traffic through the cluster IPs renders as ``expected``; then
    ``podnet trace`` must say the same of every pair."""
    wait_for(lambda: policies_applied(state_dir), timeout, "the policy tables", interval=0.2)
    seen: list[str] = []

    def settled() -> bool:
        seen.append(render(keys, traffic(state_dir, keys)))
        return seen[-1] == expected

    try:
        wait_for(settled, timeout, "the matrix through cluster IPs", interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"through cluster IPs:\n{seen[-1]}\nexpected:\n{expected}") from exc
    trace = render(keys, traced(state_dir, keys))
    assert trace == expected, f"podnet trace says:\n{trace}\ntraffic:\n{expected}"


def policies_applied(state_dir: Path) -> bool:
    """Whether every node's data plane holds the policy the API's objects compile to for
    it (nftables table or br0's policy flows, see ``planeview.policy_behind``)."""
    state = ClusterState.load(state_dir)
    assert state is not None
    with pods.admin_api(state_dir) as api:
        rules = fetch_objects(api).ruleset()
    return not planeview.policy_behind(state_dir, state, rules)
