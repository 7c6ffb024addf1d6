"""Zero failed requests across router reloads: at least 20,000 requests of four kinds
(HTTP keep-alive, HTTP with a new connection each, edge TLS, passthrough TLS) from the
external host while Routes are added and removed and a Service's endpoints change,
until the router has reloaded at least ``--reloads`` times (its own metric).

Run: sudo .venv/bin/python bench/bench_router_reloads.py [--requests 20000] [--reloads 50]

A 1-node cluster with the router (``routerlab``). Backends: web-1 and web-2 (Service
``web``; Routes ``web``, http, and ``edge``) and ``secure`` (its own TLS; Route ``pass``,
passthrough). The churn, from this process through the API: every ``--interval`` s a
Route ``churn-<n>`` (http, to ``web``) is created, and the oldest is deleted once four
exist, so the router's configuration changes and it reloads; every 15th step the
endpoints of ``web`` change: a pod web-3 joins (created Ready), or leaves as a rollout
takes it away (its label changed first, so it leaves the Service's endpoints; the pod
is deleted once 20 requests in a row went to other pods). A new pod is Ready once it
accepts connections (a readiness check), as in a rollout.

Prints per kind the requests and failures, the reloads counted by the router's metric
(``podnet_router_reloads_total``, before and after), and the churn steps. The goal is 0
failures. The load (``router_load.py``) runs in the external host's namespace.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from podnet.cluster import pods
from podnet.model.kinds import POD, ROUTE
from podnet.testing import routerclient as rc
from podnet.testing.e2e import wait_for
from routerlab import Lab, host, machine_load, router_cluster

LOAD = Path(__file__).parent / "router_load.py"


class Churn:
    """Routes added and removed, and web-3 joining and leaving ``web``."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.made: list[str] = []
        self.steps = 0
        self.scaled = 0

    def step(self) -> None:
        self.steps += 1
        name = f"churn-{self.steps}"
        self.lab.route(rc.route(name, host(name), "web"))
        self.made.append(name)
        if len(self.made) > 4:
            with pods.admin_api(self.lab.state_dir) as api:
                api.delete(ROUTE, "default", self.made.pop(0))
        if self.steps % 15 == 0:
            self.scale()

    def scale(self) -> None:
        self.scaled += 1
        if "default/web-3" not in self.lab.state.pods:
            self.lab.backend("web-3", "web")
            return
        with pods.admin_api(self.lab.state_dir) as api:  # out of the Service first
            api.patch(POD, "default", "web-3", {"metadata": {"labels": {"app": "leaving"}}})
        # A rollout's grace period: stopped once the router no longer sends it requests.
        wait_for(lambda: "web-3" not in rc.shares(self.lab.state, host("web"), 20), 60, "drain")
        pods.delete_pod(self.lab.state_dir, "web-3", say=lambda _l: None)


def start_load(lab: Lab, requests: int) -> subprocess.Popen[str]:
    argv = [sys.executable, str(LOAD), "--http", host("web"), "--edge", host("edge")]
    argv += ["--passthrough", host("pass"), "--min-requests", str(requests)]
    load = subprocess.Popen(
        ["ip", "netns", "exec", lab.ext, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert load.stdout is not None
    if load.stdout.readline().strip() != "ready":
        load.kill()
        raise RuntimeError("the load generator did not start")
    return load


def run(lab: Lab, args: argparse.Namespace) -> None:
    lab.backend("web-1", "web")
    lab.backend("web-2", "web")
    lab.backend("secure", "secure", tls=True)
    lab.service("web")
    lab.service("secure", tls=True)
    lab.route(rc.route("web", host("web"), "web"))
    lab.route(rc.route("edge", host("edge"), "web", tls={"termination": "edge"}))
    passthrough = {"termination": "passthrough"}
    lab.route(rc.route("pass", host("pass"), "secure", tls=passthrough, port="https"))
    for url in (f"http://{host('web')}/", f"https://{host('edge')}/", f"https://{host('pass')}/"):
        lab.served(url)
    before = lab.reloads()
    load = start_load(lab, args.requests)
    started = time.monotonic()
    churn = Churn(lab)
    try:
        while lab.reloads() - before < args.reloads:
            churn.step()
            time.sleep(args.interval)
        assert load.stdin is not None
        load.stdin.write("stop\n")
        load.stdin.flush()
        out, _ = load.communicate(timeout=900)
    finally:
        if load.poll() is None:
            load.kill()
    elapsed = time.monotonic() - started
    report(json.loads(out), lab.reloads() - before, churn, elapsed)


def report(
    tallies: dict[str, dict[str, object]], reloads: int, churn: Churn, elapsed: float
) -> None:
    total = sum(int(str(t["requests"])) for t in tallies.values())
    failed = sum(int(str(t["failures"])) for t in tallies.values())
    print(f"\n{machine_load()}; {elapsed:.0f} s")
    for kind, tally in tallies.items():
        line = f"  {kind:<12} {tally['requests']:>7} requests, {tally['failures']} failed"
        line += (
            f" ({tally['retries']} retried on a closed kept-alive connection)"
            if tally["retries"]
            else ""
        )
        print(line + (f"  e.g. {tally['samples']}" if tally["failures"] else ""))
    changes = f"{churn.steps} route changes, {churn.scaled} endpoint changes"
    print(f"reloads (router metric): {reloads}; churn: {changes}")
    print(f"FAILED REQUESTS: {failed} of {total}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--reloads", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.3, help="seconds between route changes")
    args = parser.parse_args()
    with router_cluster() as lab:
        run(lab, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
