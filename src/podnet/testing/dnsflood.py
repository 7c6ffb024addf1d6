"""A DNS flood from one pod of a real local cluster, for the flood test and benchmark.

- ``Flood``: a UDP query sender in one pod's network namespace, as fast as one core
  lets it, for a bounded time; it also reads what comes back, and prints what it sent
  and what was answered;
- ``probe``: another pod asks one name ``count`` times, one query at a time, each
  given ``timeout`` seconds and ``tries`` sends: the latency of each, or None when
  unanswered;
- ``restart_agent``: a node's agent restarted with extra flags (its ``/metrics`` on
  the node namespace's loopback), recorded in the cluster state as ``cluster up`` does;
- ``metrics``: that ``/metrics`` read from inside the node namespace.

Every process is bounded in time and runs in a namespace the cluster made; the
flooder's and prober's targets are the node's pod-subnet gateway only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from podnet import netns
from podnet.cluster import nodes
from podnet.cluster.state import ClusterState, spawn

FLOODER = """
import json, socket, sys, time
from dnslib import DNSRecord
gateway, seconds, names, fresh = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
packets = [bytes(DNSRecord.question(name).pack()) for name in names.split(",")]
template = bytes(DNSRecord.question("x000000." + names.split(",")[0]).pack())
at = template.index(b"x000000") + 1
def packet(n):
    if fresh == "fresh":  # a new name each time: x<6 digits>.<first name>
        return template[:at] + b"%06d" % (n % 10**6) + template[at + 6 :]
    return packets[n % len(packets)]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
s.connect((gateway, 53))
sent = answered = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(50):
        try:
            s.send(packet(sent))
            sent += 1
        except (BlockingIOError, ConnectionRefusedError):
            break
    while True:
        try:
            s.recv(4096)
            answered += 1
        except (BlockingIOError, ConnectionRefusedError):
            break
print(json.dumps({"sent": sent, "answered": answered}), flush=True)
"""

PROBER = """
import json, socket, sys, time
from dnslib import DNSRecord
gateway, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
timeout, interval, tries = float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
def ask(s, query):
    s.send(query.pack())
    while True:
        answer = DNSRecord.parse(s.recv(4096))
        if answer.header.id == query.header.id:
            return answer
found = []
for _ in range(count):
    query = DNSRecord.question(name)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.connect((gateway, 53))
        start, took = time.monotonic(), None
        for _ in range(tries):
            try:
                if ask(s, query).rr:
                    took = (time.monotonic() - start) * 1000
                break
            except (socket.timeout, ConnectionRefusedError):
                continue
        found.append(took)
    time.sleep(interval)
print(json.dumps(found), flush=True)
"""


class Flood:
    """``FLOODER`` in ``pod_netns`` against ``gateway`` for ``seconds``, asking ``names``
    in turn (``fresh``: a new name under the first of them each time, which no cache
    answers); ``result`` waits for its counts."""

    def __init__(
        self, pod_netns: str, gateway: str, seconds: float, names: list[str], fresh: bool = False
    ) -> None:
        mode = "fresh" if fresh else "same"
        argv = [sys.executable, "-c", FLOODER, gateway, str(seconds), ",".join(names), mode]
        self.seconds = seconds
        self.process = subprocess.Popen(
            netns.command(pod_netns, argv), stdout=subprocess.PIPE, text=True
        )

    def result(self) -> dict[str, int]:
        """What it sent and what was answered (after it ends by itself)."""
        out, _ = self.process.communicate(timeout=self.seconds + 30)
        return dict(json.loads(out))

    def stop(self) -> None:
        """Kill it (by its PID) if it still runs."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def probe(
    pod_netns: str,
    gateway: str,
    name: str,
    count: int,
    timeout: float = 1.0,
    interval: float = 0.02,
    tries: int = 1,
) -> list[float | None]:
    """ms of each of ``count`` queries for ``name``, each sent up to ``tries`` times
    (None: not answered with records)."""
    argv = [sys.executable, "-c", PROBER, gateway, name, str(count), str(timeout)]
    argv += [str(interval), str(tries)]
    limit = count * (timeout * tries + interval) + 30
    done = netns.run(pod_netns, argv, timeout=limit)
    if done.returncode != 0:
        raise RuntimeError(f"the prober failed: {done.stderr}")
    return list(json.loads(done.stdout))


def restart_agent(state_dir: Path, node: str, extra: list[str]) -> None:
    """Stop ``node``'s agent and start it again with ``extra`` flags added."""
    state = ClusterState.load(state_dir)
    assert state is not None, f"no cluster at {state_dir}"
    record = state.nodes[node]
    nodes.stop_agent(record)
    paths = nodes.node_paths(state_dir, node)
    command = nodes.agent_command(state, record, paths) + extra
    env = {"KUBECONFIG": str(paths.kubeconfig)}
    record.agent = spawn(command, paths.agent_log, nodes.agent_needle(paths), env=env)
    state.save(state_dir)


def metrics(node_netns: str, port: int, timeout: float = 30.0) -> str:
    """The agent's ``/metrics`` on the node namespace's 127.0.0.1:``port`` (retried
    until it answers, for at most ``timeout`` seconds)."""
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + timeout
    while True:
        done = netns.run(node_netns, ["curl", "-sf", "--max-time", "5", url], timeout=30)
        if done.returncode == 0:
            return done.stdout
        if time.monotonic() > deadline:
            raise RuntimeError(f"no /metrics at {url} in {node_netns}: {done.stderr}")
        time.sleep(0.2)


def counter(text: str, sample: str) -> float:
    """The value of ``sample`` (a name with its labels, as printed) in ``text``; 0 when
    it is not there."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0
