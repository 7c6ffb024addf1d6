"""The router with many routes: route change -> served latency, HAProxy reload time, and
the memory of the router process and of HAProxy, at 1,000 and 10,000 routes.

Run: sudo .venv/bin/python bench/bench_router_scale.py [--routes 1000 10000] [--changes 30]

A 1-node cluster with the router (``routerlab``), one httpecho pod behind Service
``web``. For each size N (ascending), Routes ``r-<i>`` (http, host
``r-<i>.apps.podnet.test``, to ``web``) are created through the API until N exist, and
the last one is waited for (served from the external host). Then:

- **route change -> served**: ``--changes`` times, a new Route ``probe-<k>`` is created
  and a poller on the external host (told the host just before the create) requests it
  every 5 ms until the router answers 200; the time from the create to the first 200;
  then it is deleted, and the next change waits ``--gap`` s: the router merges the
  changes of one reload interval (``podnet router --reload-interval``, 0.5 s by
  default), so a change right behind another waits for the interval to end, which
  ``--gap 0`` shows. p50, p99
  and max (the goal: p99 < 1 s at 1,000 routes);
- **reload time**: the router's ``podnet_router_last_reload_seconds`` after each of those
  changes (each one reloads HAProxy: a new backend), median and max;
- **memory**: VmRSS of the router process and of all HAProxy processes in the router
  pod (master and workers, summed), after the changes.

Each size's line is printed as soon as it is measured, and all of them at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from podnet.cluster import pods
from podnet.model.kinds import ROUTE
from podnet.testing import routerclient as rc
from podnet.testing.e2e import wait_for
from routerlab import Lab, host, machine_load, router_cluster

POLLER = """\
import http.client, socket, sys, time
ip = socket.gethostbyname(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    name = line.strip()
    started = time.monotonic()
    while time.monotonic() - started < 30:
        c = http.client.HTTPConnection(ip, 80, timeout=5)
        try:
            c.request("GET", "/", headers={"Host": name})
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        finally:
            c.close()
        time.sleep(0.005)
    print(f"{time.monotonic() - started:.4f}", flush=True)
"""


def fill(lab: Lab, upto: int, have: int) -> int:
    """Routes r-<have>..r-<upto-1> created; the new count."""
    started = time.monotonic()
    with pods.admin_api(lab.state_dir) as api:
        for i in range(have, upto):
            api.create(ROUTE, rc.route(f"r-{i}", host(f"r-{i}"), "web"), namespace="default")
    took = time.monotonic() - started
    print(f"  {upto - have} routes created in {took:.1f} s")
    started = time.monotonic()
    lab.served(f"http://{host(f'r-{upto - 1}')}/", timeout=600)
    print(f"  the last one served {time.monotonic() - started:.1f} s after the creates")
    return upto


def reloaded_since(lab: Lab, count: int) -> Callable[[], bool]:
    """A check: the router counts more reloads than ``count``."""
    return lambda: lab.reloads() > count


def changes(lab: Lab, count: int, gap: float) -> tuple[list[float], list[float]]:
    """``count`` route creates timed until served, and the reload time after each."""
    poller = subprocess.Popen(
        ["ip", "netns", "exec", lab.ext, sys.executable, "-c", POLLER, host("web")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert poller.stdin is not None and poller.stdout is not None
    served, reloads = [], []
    try:
        assert poller.stdout.readline().strip() == "ready"
        with pods.admin_api(lab.state_dir) as api:
            for k in range(count):
                name = f"probe-{k}"
                before = lab.reloads()
                poller.stdin.write(host(name) + "\n")
                poller.stdin.flush()
                api.create(ROUTE, rc.route(name, host(name), "web"), namespace="default")
                served.append(float(poller.stdout.readline()))
                # The driver counts a reload once it is done, which can be just after
                # the new worker answered.
                with contextlib.suppress(AssertionError):  # served without a reload
                    wait_for(reloaded_since(lab, before), 10, "the reload counted")
                    reloads.append(lab.metrics().get("podnet_router_last_reload_seconds", 0.0))
                api.delete(ROUTE, "default", name)
                time.sleep(gap)  # the delete's reload, and the reload interval, pass
    finally:
        poller.kill()
        poller.wait(5)
    return served, reloads


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def line(size: int, served: list[float], reloads: list[float], rss: dict[str, int]) -> str:
    """One size's figures."""
    p99 = percentile(served, 0.99)
    reload_ms = statistics.median(reloads) * 1000 if reloads else float("nan")
    return (
        f"{size:>6} routes: served p50 {statistics.median(served) * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, max {max(served) * 1000:.0f} ms; "
        f"reload median {reload_ms:.0f} ms over {len(reloads)}; "
        f"RSS router {rss['router'] / 1024:.0f} MiB, HAProxy {rss['haproxy'] / 1024:.0f} MiB"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--routes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--changes", type=int, default=30)
    parser.add_argument("--gap", type=float, default=2.0, help="seconds between changes")
    args = parser.parse_args()
    rows = []
    with router_cluster() as lab:
        lab.backend("web-1", "web")
        lab.service("web")
        lab.route(rc.route("web", host("web"), "web"))
        lab.served(f"http://{host('web')}/")
        have = 0
        for size in sorted(args.routes):
            print(f"== {size} routes")
            have = fill(lab, size, have)
            served, reloads = changes(lab, args.changes, args.gap)
            rows.append(line(size, served, reloads, lab.rss_kib()))
            print(f"  {rows[-1]}\n  {machine_load()}", flush=True)
    print("\n" + "\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
