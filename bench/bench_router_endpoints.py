"""Scale-up and scale-down through the router: how long after an endpoint change the
router's routing shows it (issue 12: "within 1 s"; the e2e test only waits for it).

Run: sudo .venv/bin/python bench/bench_router_endpoints.py [--changes 10]

A 1-node cluster with the router (``routerlab``), Service ``web`` with pod web-0 behind
the http Route ``web``. Each change:

- **scale-up**: a pod web-<k> runs, Ready, labelled ``app=standby``; its label becomes
  ``app=web`` (the endpoints controller puts it in the Service's EndpointSlice, the router
  adds the server); from just before that API write, a poller on the external host
  requests the route (a new connection each, every 5 ms); to the request web-<k>
  answers first;
- **scale-down**: the label goes back to ``app=standby`` (as a rollout takes a pod out
  before stopping it); from that write to the first of 20 answers in a row from other
  pods. Then the pod is deleted.

A label write is the change because it has a precise moment; a new pod's Ready is
written by its prober at a moment the bench does not see.

p50, p99 and max of each (the poller's own request time included: it is what a client
sees). The router takes endpoint changes over HAProxy's runtime API where it can (no
reload); the router's reloads during the run are printed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from podnet.cluster import pods
from podnet.model.kinds import POD
from podnet.testing import routerclient as rc
from routerlab import Lab, host, machine_load, router_cluster

RELOADS = "podnet_router_reloads_total"
POLLER = """\
import http.client, json, socket, sys, time
ip = socket.gethostbyname(sys.argv[1])
def served_by():
    c = http.client.HTTPConnection(ip, 80, timeout=5)
    try:
        c.request("GET", "/", headers={"Host": sys.argv[1]})
        r = c.getresponse()
        body = r.read()
        return json.loads(body).get("pod", "") if r.status == 200 else str(r.status)
    except (OSError, ValueError):
        return "error"
    finally:
        c.close()
print("ready", flush=True)
for line in sys.stdin:
    verb, pod = line.split()
    started, streak, since = time.monotonic(), 0, 0.0
    while time.monotonic() - started < 60:
        asked = time.monotonic()
        got = served_by()
        if verb == "appear" and got == pod:
            since = asked
            break
        if verb == "vanish" and got not in (pod, "error"):
            since, streak = (since if streak else asked), streak + 1
        else:
            streak = 0
        if streak >= 20:
            break
        time.sleep(0.005)
    print(f"{since - started:.4f}", flush=True)
"""


def relabel(lab: Lab, pod: str, app: str) -> Callable[[], None]:
    """The change: pod's ``app`` label set to ``app`` (in or out of Service ``web``)."""

    def change() -> None:
        with pods.admin_api(lab.state_dir) as api:
            api.patch(POD, "default", pod, {"metadata": {"labels": {"app": app}}})

    return change


def timed(poller: subprocess.Popen[str], verb: str, pod: str, change: Callable[[], None]) -> float:
    """Seconds from just before ``change`` until the poller saw ``pod`` appear or vanish."""
    assert poller.stdin is not None and poller.stdout is not None
    poller.stdin.write(f"{verb} {pod}\n")
    poller.stdin.flush()
    change()
    return float(poller.stdout.readline())


def summary(label: str, values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"{label}: p50 {statistics.median(values) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
        f"max {max(values) * 1000:.0f} ms over {len(values)}"
    )


def run(lab: Lab, changes: int) -> tuple[list[float], list[float]]:
    lab.backend("web-0", "web")
    lab.service("web")
    lab.route(rc.route("web", host("web"), "web"))
    lab.served(f"http://{host('web')}/")
    poller = subprocess.Popen(
        ["ip", "netns", "exec", lab.ext, sys.executable, "-c", POLLER, host("web")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    ups, downs = [], []
    try:
        assert poller.stdout is not None and poller.stdout.readline().strip() == "ready"
        for k in range(1, changes + 1):
            name = f"web-{k}"
            lab.backend(name, "standby")  # Ready and serving, outside the Service
            ups.append(timed(poller, "appear", name, relabel(lab, name, "web")))
            downs.append(timed(poller, "vanish", name, relabel(lab, name, "standby")))
            pods.delete_pod(lab.state_dir, name, say=lambda _line: None)
            print(f"  {name}: up {ups[-1] * 1000:.0f} ms, down {downs[-1] * 1000:.0f} ms")
    finally:
        poller.kill()
        poller.wait(5)
    return ups, downs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=10)
    args = parser.parse_args()
    with router_cluster() as lab:
        before = lab.metrics()
        ups, downs = run(lab, args.changes)
        after = lab.metrics()
    reloads = int(after.get(RELOADS, 0) - before.get(RELOADS, 0))
    print(f"\n{machine_load()}; router reloads during the run: {reloads}")
    print(summary("scale-up -> served by the new pod", ups))
    print(summary("scale-down -> no longer served", downs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
