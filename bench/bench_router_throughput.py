"""Requests/s and p99 latency through the router against the same pod reached directly,
HTTP and TLS, with wrk on the external host: same run, same pod, same client.

Run: sudo .venv/bin/python bench/bench_router_throughput.py [--rounds 5] [--seconds 5]
     [--connections 16]

A 1-node cluster with the router (``routerlab``); one httpecho pod (HTTP 8080, HTTPS
8443 with its own CA) behind a Service, an http Route (``web``) and an edge Route
(``edge``: TLS ends at HAProxy, plain HTTP to the pod), both to the Service's port
``http`` (``routerclient.echo_routes``). The paths per round:

- HTTP through the router: ``http://web.apps.podnet.test/`` (node1:80, DNAT, HAProxy, pod);
- HTTP direct: ``http://<pod IP>:8080/`` (node1 routes the external host to the pod);
- TLS through the router (edge): ``https://edge.apps.podnet.test/``;
- TLS direct: ``https://<pod IP>:8443/`` (the pod's own TLS).

wrk keeps its connections open (keep-alive), one thread. Each round runs the pairs in
alternating order (ABBA) so the drift of a shared machine weighs on both; the result is
the median over rounds of router/direct (requests/s and p99), with the medians of each.
The backend is a Python server, so it bounds both sides: the ratio shows what the router
costs on top of it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from podnet.testing import routerclient as rc
from podnet.testing.wrk import command as wrk_command
from podnet.testing.wrk import parse as parse_wrk
from routerlab import Lab, host, machine_load, router_cluster


def wrk(lab: Lab, url: str, seconds: int, connections: int) -> tuple[float, float]:
    """Requests/s and p99 (ms) of one wrk run against ``url`` from the external host;
    errors of any class are printed (a run with errors measures something else)."""
    done = lab.in_ext(wrk_command(url, seconds, connections), timeout=seconds + 30)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed: {done.stderr or done.stdout}")
    run = parse_wrk(done.stdout)
    if any(run.errors.values()):
        shown = ", ".join(f"{name} {count}" for name, count in run.errors.items())
        print(f"    wrk {url}: {run.requests} answers; errors: {shown}")
    return run.rate, run.p99_ms


Sample = tuple[float, float]  # requests/s, p99 ms


def report(label: str, router: list[Sample], direct: list[Sample]) -> str:
    """One line: the medians of each side and of the per-round ratios."""
    rates = statistics.median(r[0] / d[0] for r, d in zip(router, direct, strict=True))
    p99s = statistics.median(r[1] / d[1] for r, d in zip(router, direct, strict=True))
    through = f"{statistics.median(r[0] for r in router):.0f} req/s"
    through += f" p99 {statistics.median(r[1] for r in router):.1f} ms"
    plain = f"{statistics.median(d[0] for d in direct):.0f} req/s"
    plain += f" p99 {statistics.median(d[1] for d in direct):.1f} ms"
    ratio = f"router/direct req/s {rates:.2f}, p99 {p99s:.2f}"
    return f"{label}: router {through}; direct {plain}; {ratio}"


def measure(lab: Lab, pairs: dict[str, tuple[str, str]], args: argparse.Namespace) -> None:
    """The rounds (ABBA), then one line per pair."""
    results: dict[str, dict[str, list[Sample]]] = {k: {"router": [], "direct": []} for k in pairs}
    for n in range(args.rounds):
        for label, (routed, direct) in pairs.items():
            order = [("router", routed), ("direct", direct)]
            for side, url in order[::-1] if n % 2 else order:
                got = wrk(lab, url, args.seconds, args.connections)
                results[label][side].append(got)
                print(f"  round {n + 1} {label} {side}: {got[0]:.0f} req/s, p99 {got[1]:.1f} ms")
    print(f"\n{machine_load()}; {args.connections} connections, {args.seconds} s x {args.rounds}")
    for label, sides in results.items():
        print(report(label, sides["router"], sides["direct"]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    with router_cluster() as lab:
        pod = lab.backend("web-1", "web", tls=True)
        lab.service("web", tls=True)
        for route in rc.echo_routes("web", host("web"), host("edge")):
            lab.route(route)
        lab.served(f"http://{host('web')}/")
        lab.served(f"https://{host('edge')}/")
        with lab.direct_route(pod) as ip:
            pairs = {
                "HTTP": (f"http://{host('web')}/", f"http://{ip}:8080/"),
                "TLS (edge vs pod TLS)": (f"https://{host('edge')}/", f"https://{ip}:8443/"),
            }
            measure(lab, pairs, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
