"""The readiness prober of one local-cluster pod: the kubelet's probe loop, one process per
pod that has a readiness check.

It runs as root inside the pod's *node* namespace (as a kubelet runs on its node) and
speaks to the API with the node's identity, which may write the status of pods bound to
that node (NodeRestriction). Every ``period`` it probes once, bounded by ``timeout``:

- ``--tcp PORT``: a TCP connect to the pod's address, from a socket opened inside the
  pod's network namespace (so no policy and no route stands between);
- ``--exec-json ARGV``: the command, already wrapped to run in the pod's namespace and
  sandbox as the pod's user; its whole process group is killed at the timeout.

Results go through ``ReadinessTracker``; the Pod's Ready/ContainersReady conditions are
written at start (not ready), on each flip, and again after a failed write. When the
pod's process is gone the pod is written not ready and the prober exits; it exits too
once the Pod object is deleted. It stops on SIGTERM (the pod's teardown) without writing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from podnet import netns
from podnet.cluster.readiness import (
    ReadinessCheck,
    ReadinessTracker,
    readiness_status,
    rfc3339,
)
from podnet.cluster.sandbox import pod_environment
from podnet.cluster.state import ProcessRecord

log = logging.getLogger("podnet.cluster.prober")


def tcp_probe(pod_netns: str, address: str, port: int, timeout: float) -> bool:
    """Whether ``address:port`` accepts a TCP connection, seen from inside ``pod_netns``."""
    with netns.entered(pod_netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        sock.settimeout(timeout)
        try:
            sock.connect((address, port))
        except OSError:
            return False
    return True


def exec_probe(argv: Sequence[str], timeout: float) -> bool:
    """Whether ``argv`` exits 0 within ``timeout``; its process group is killed after."""
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=pod_environment(),
    )
    try:
        return process.wait(timeout) == 0
    except subprocess.TimeoutExpired:
        return False
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class PodStatusReporter:
    """Writes the readiness part of one Pod's status with the node's client."""

    def __init__(self, api: Any, namespace: str, name: str) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.gone = False  # the Pod object was deleted: nothing left to report to

    def write(self, ready: bool, running: bool) -> bool:
        """PATCH pods/status; False (logged) when the API refused or did not answer."""
        from podnet.client import ClientError, NotFound
        from podnet.model.kinds import POD

        try:
            pod = self.api.get(POD, self.namespace, self.name)
            status = readiness_status(ready, running, rfc3339(datetime.now(UTC)), pod.get("status"))
            if not running:  # how the container ended is the node's exit watcher's to write
                status = {"conditions": status["conditions"]}
            patch = {"status": status}
            self.api.patch(POD, self.namespace, self.name, patch, subresource="status")
        except NotFound:
            log.info("pod %s/%s: the Pod object is gone; stopping", self.namespace, self.name)
            self.gone = True
            return False
        except ClientError as exc:
            log.warning("pod %s/%s: readiness not written: %s", self.namespace, self.name, exc)
            return False
        log.info("pod %s/%s: ready=%s", self.namespace, self.name, ready)
        return True


def probe_loop(
    check: ReadinessCheck,
    probe: Callable[[], bool],
    alive: Callable[[], bool],
    report: Callable[[bool, bool], bool],
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Probe every ``check.period`` while ``alive()``; ``report(ready, running)`` at start,
    on each flip and after a failed report; a last not-ready report when the pod is gone."""
    tracker = ReadinessTracker(check.successes, check.failures)
    pending = not report(False, True)
    while alive():
        started = time.monotonic()
        flipped = tracker.observe(probe())
        if flipped or pending:
            pending = not report(tracker.ready, True)
        sleep(max(0.0, check.period - (time.monotonic() - started)))
    report(False, False)


def _arguments(args: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--netns", required=True, help="the pod's network namespace")
    parser.add_argument("--address", required=True, help="the pod's IP")
    parser.add_argument("--pod-pid", type=int, required=True)
    parser.add_argument("--pod-start", type=int, required=True)
    parser.add_argument("--pod-needle", required=True)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--tcp", type=int)
    what.add_argument("--exec-json", help="the wrapped command as a JSON list")
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--successes", type=int, default=1)
    parser.add_argument("--failures", type=int, default=3)
    return parser.parse_args(args)


def main(args: Sequence[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    from podnet.client.sync import ApiClient
    from podnet.kubeconfig import load_client_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    opts = _arguments(args)
    argv = json.loads(opts.exec_json) if opts.exec_json else None
    check = ReadinessCheck(
        opts.tcp, " ".join(argv) if argv else None, opts.period, opts.timeout,
        opts.successes, opts.failures,
    )  # fmt: skip
    pod = ProcessRecord(opts.pod_pid, opts.pod_needle, opts.pod_start)

    def probe() -> bool:
        if argv is not None:
            return exec_probe(argv, check.timeout)
        return tcp_probe(opts.netns, opts.address, int(opts.tcp), check.timeout)

    with ApiClient(load_client_config(opts.kubeconfig)) as api:
        reporter = PodStatusReporter(api, opts.namespace, opts.name)
        probe_loop(check, probe, lambda: pod.alive() and not reporter.gone, reporter.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
