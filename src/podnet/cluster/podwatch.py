"""The pod exit watcher of one local-cluster node: the kubelet's "container died" path,
one process per node for all its pods (not one per pod).

``podnet pod run`` registers each pod it starts on the node as a file
``<node dir>/pods/<namespace>_<name>.json`` (PID, start time, command line) and removes
it with the pod. The watcher runs in the node's namespace with the node's identity (as a
kubelet does) and waits, in one ``select``, on:

- a pidfd per registered pod process: readable when the process has ended;
- one proc connector socket (netlink, ``podnet.cluster.podexit``), which the kernel only
  serves in the initial network namespace: the watcher starts there, opens it, and then
  enters the node's namespace for the rest (a socket stays where it was made). It
  carries each exit's wait status, which a pidfd does not give to a process that is not
  the parent. Only the statuses of registered PIDs are kept.

When a pod's process ends the watcher writes the Pod's status (phase Succeeded/Failed by
the exit code, not Ready, the container ``terminated``), so the endpoints controller
drops the pod, and renames the registration to ``.done`` (a restarted watcher does not
report twice). A process that is gone when first seen is reported with its exit code
unknown. The registrations are read again every ``RESCAN`` seconds. SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import select
import signal
import socket
import sys
import time
from collections import OrderedDict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from podnet import netns
from podnet.cluster.podexit import (
    CN_IDX_PROC,
    NETLINK_CONNECTOR,
    UNKNOWN,
    Ended,
    exits,
    listen_request,
    terminated_status,
)
from podnet.cluster.readiness import rfc3339
from podnet.cluster.state import ProcessRecord, proc_start_time

log = logging.getLogger("podnet.cluster.podwatch")
RESCAN = 0.5
EVENT_GRACE = 2.0  # how long an ended process's exit status is awaited
EVENT_POLL = 0.02
RECENT = 8192  # exits remembered
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
RECEIVE = 1 << 16


def registration_dir(node_dir: Path) -> Path:
    return node_dir / "pods"


def registration(node_dir: Path, namespace: str, name: str) -> Path:
    return registration_dir(node_dir) / f"{namespace}_{name}.json"


def register(node_dir: Path, namespace: str, name: str, process: ProcessRecord) -> None:
    """Tell the node's watcher about a pod's process (written atomically)."""
    path = registration(node_dir, namespace, name)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    body = {"namespace": namespace, "name": name, "pid": process.pid}
    body |= {"start": process.start, "needle": process.needle}
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(body))
    temporary.replace(path)


def unregister(node_dir: Path, namespace: str, name: str) -> None:
    path = registration(node_dir, namespace, name)
    path.unlink(missing_ok=True)
    path.with_suffix(".done").unlink(missing_ok=True)


def open_exit_events() -> socket.socket:
    """A proc connector socket subscribed to exits (in this process's network namespace,
    which must be the initial one: the kernel serves the connector only there)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((0, CN_IDX_PROC))
    sock.send(listen_request(sock.getsockname()[0]))
    sock.setblocking(False)
    return sock


def ready_file(node_dir: Path) -> Path:
    """Written with the watcher's PID once it receives exit events."""
    return registration_dir(node_dir) / ".watching"


class Watched:
    """One registered pod process and its pidfd (None: it was gone when first seen)."""

    def __init__(self, path: Path, body: dict[str, Any]) -> None:
        self.path = path
        self.namespace, self.name = str(body["namespace"]), str(body["name"])
        self.process = ProcessRecord(int(body["pid"]), str(body["needle"]), int(body["start"]))
        self.started_at = rfc3339(datetime.now(UTC))
        self.fd: int | None = None
        if self.process.alive():
            with contextlib.suppress(ProcessLookupError):
                self.fd = os.pidfd_open(self.process.pid)
        if self.fd is not None and proc_start_time(self.process.pid) != self.process.start:
            os.close(self.fd)  # the PID was reused between the check and the open
            self.fd = None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class PodWatcher:
    """The loop of one node's watcher (see the module docstring)."""

    def __init__(self, api: Any, node_dir: Path, events: socket.socket) -> None:
        self.api = api
        self.directory = registration_dir(node_dir)
        self.events = events
        self.watched: dict[Path, Watched] = {}
        # PID -> (wait status, ns since boot) of the machine's latest exits, so a pod that
        # ended before its registration was read still has its exit code.
        self.recent: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self.ended: dict[Path, Ended] = {}  # reports not yet written
        self.exited: dict[Path, float] = {}  # pidfd fired at (monotonic); status awaited
        self.stopping = False

    def rescan(self) -> None:
        present = set(self.directory.glob("*.json")) if self.directory.is_dir() else set()
        for path in list(self.watched):
            if path not in present:  # the pod was deleted
                self.watched.pop(path).close()
                self.ended.pop(path, None)
                self.exited.pop(path, None)
        for path in present - set(self.watched):
            try:
                watched = Watched(path, json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring registration %s: %s", path, exc)
                continue
            self.watched[path] = watched
            if watched.fd is None:  # already ended: its status is in ``recent``, or soon
                self.exited[path] = time.monotonic()

    def drain_events(self) -> None:
        while True:
            try:
                data = self.events.recv(RECEIVE)
            except BlockingIOError:
                return
            except OSError as exc:  # ENOBUFS: events were lost; the pidfds still tell
                log.warning("process events lost: %s", exc)
                continue
            for pid, status, stamp in exits(data):
                self.recent[pid] = (status, stamp)
                self.recent.move_to_end(pid)
                if len(self.recent) > RECENT:
                    self.recent.popitem(last=False)

    def exit_of(self, watched: Watched) -> Ended | None:
        """How the watched process ended, if its exit was seen (an exit of that PID from
        before the process started is another process's)."""
        found = self.recent.get(watched.process.pid)
        if found is None:
            return None
        status, stamp = found
        started = watched.process.start / CLOCK_TICKS - 1.0  # ticks are coarse
        return Ended.from_wait_status(status) if stamp / 1e9 >= started else None

    def turn(self, timeout: float = RESCAN) -> None:
        """Wait for exits (at most ``timeout``), then report every pod found ended.

        The kernel wakes a pidfd (exit_notify) before it sends the exit event, so a
        process whose pidfd fired waits up to ``EVENT_GRACE`` for its exit status."""
        fds = {w.fd: p for p, w in self.watched.items() if w.fd is not None}
        wait = min(timeout, EVENT_POLL) if self.exited else timeout
        readable, _, _ = select.select([self.events.fileno(), *fds], [], [], wait)
        self.drain_events()
        now = time.monotonic()
        for fd in readable:
            if fd in fds:
                self.exited[fds[fd]] = now
                self.watched[fds[fd]].close()
        for path, since in list(self.exited.items()):
            ended = self.exit_of(self.watched[path])
            if ended is not None:
                self.ended[path] = ended
            elif now - since >= EVENT_GRACE:
                self.ended[path] = UNKNOWN
            else:
                continue
            del self.exited[path]
        for path, ended in list(self.ended.items()):
            if self.report(self.watched[path], ended):
                del self.ended[path]
                self.watched.pop(path).close()
                with contextlib.suppress(OSError):
                    path.replace(path.with_suffix(".done"))

    def report(self, watched: Watched, ended: Ended) -> bool:
        """Write the pod's terminated status; False to try again next turn."""
        from podnet.client import ClientError, NotFound
        from podnet.model.kinds import POD

        now = rfc3339(datetime.now(UTC))
        try:
            pod = self.api.get(POD, watched.namespace, watched.name)
            started = _started_at(pod) or watched.started_at
            status = terminated_status(ended, started, now, pod.get("status"))
            self.api.patch(
                POD, watched.namespace, watched.name, {"status": status}, subresource="status"
            )
        except NotFound:
            return True
        except ClientError as exc:
            log.warning("pod %s/%s: exit not written: %s", watched.namespace, watched.name, exc)
            return False
        log.info(
            "pod %s/%s: process %d ended, exit code %d%s",
            watched.namespace,
            watched.name,
            watched.process.pid,
            ended.exit_code,
            "" if ended.known else " (not seen: unknown)",
        )
        return True

    def run(self) -> None:
        while not self.stopping:
            self.rescan()
            self.turn()


def _started_at(pod: Any) -> str | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        running = (status.get("state") or {}).get("running") or {}
        if running.get("startedAt"):
            return str(running["startedAt"])
    return (pod.get("status") or {}).get("startTime")


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m podnet.cluster.podwatch --kubeconfig K --node-dir D``."""
    from podnet.client.sync import ApiClient
    from podnet.kubeconfig import load_client_config

    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--kubeconfig", required=True, help="the node's")
    parser.add_argument("--node-dir", required=True, type=Path)
    parser.add_argument("--netns", required=True, help="the node's network namespace")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    events = open_exit_events()  # first, here in the initial namespace; then the node's
    with netns.entered(args.netns), ApiClient(load_client_config(args.kubeconfig)) as api:
        watcher = PodWatcher(api, args.node_dir, events)

        def stop(*_: object) -> None:
            watcher.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        print(f"podwatch: watching {registration_dir(args.node_dir)}", flush=True)
        registration_dir(args.node_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
        ready_file(args.node_dir).write_text(str(os.getpid()))
        watcher.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
