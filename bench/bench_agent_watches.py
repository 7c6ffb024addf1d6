"""The node agent's watches and memory with shared informers, against a baseline tree.

Run: .venv/bin/python bench/bench_agent_watches.py --baseline-src /path/to/old/src
     [--services 1000] [--endpoints 10] [--pods 5000] [--runs 1]

One real etcd and master (``networkpolicy`` plugin) on loopback, loaded through the API
with ``--services`` Services without a selector, one EndpointSlice each with
``--endpoints`` endpoints, ``--pods`` Pods in 50 namespaces (on other nodes). Then a
``podnet node --dataplane fake`` agent, alternately from this tree and from the
``--baseline-src`` tree (``PYTHONPATH``; a ``git worktree`` of the commit to compare
with), each a fresh process against the same objects: the watches it holds open at the
master (``podnet_apiserver_watchers``, after minus before), and its RSS and peak (VmHWM)
once policy and services are applied and the DNS has listed, after a quiet spell. No
root needed; nothing outside the temporary directory is touched.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_policy import NAMESPACES, pod_object, post_all, rss_mb
from bench_service_agent import NAMESPACE, service_object, slice_object
from podnet.master import node_credentials
from podnet.store.etcd_process import start_etcd
from podnet.testing.api import client_for
from podnet.testing.processes import MasterProcess, launch_master

NODE = "node-1"
QUIET = 5.0  # seconds after the last readiness line before RSS is read
TIMEOUT = 600.0
GAUGE = re.compile(r'^podnet_apiserver_watchers\{resource="([^"]+)"\} ([0-9.e+]+)$', re.M)


def watchers(master: MasterProcess) -> dict[str, int]:
    with client_for(master.kubeconfig) as api:
        text = api.get("/metrics").text
    return {kind: int(float(count)) for kind, count in GAUGE.findall(text)}


def load(master: MasterProcess, services: int, endpoints: int, pods: int) -> None:
    def namespace(name: str) -> tuple[str, dict[str, Any]]:
        return "/api/v1/namespaces", {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name},
        }

    names = [NAMESPACE, *(f"ns{k}" for k in range(NAMESPACES))]
    asyncio.run(post_all(master.kubeconfig, [namespace(n) for n in names]))
    svc = f"/api/v1/namespaces/{NAMESPACE}/services"
    slices = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
    asyncio.run(post_all(master.kubeconfig, [(svc, service_object(i)) for i in range(services)]))
    items = [(slices, slice_object(i, endpoints)) for i in range(services)]
    asyncio.run(post_all(master.kubeconfig, items))
    made = [
        (
            f"/api/v1/namespaces/ns{i % NAMESPACES}/pods",
            pod_object(
                i, f"other{i % 20}", f"10.{129 + i // 60000}.{(i // 250) % 240}.{i % 250 + 2}"
            ),
        )
        for i in range(pods)
    ]
    asyncio.run(post_all(master.kubeconfig, made))


def agent_command(root: Path, kubeconfig: Path) -> list[str]:
    args = [sys.executable, "-m", "podnet", "node", "--kubeconfig", str(kubeconfig)]
    args += ["--node-name", NODE, "--node-ip", "192.0.2.10", "--socket", str(root / "cni.sock")]
    for option in ("cni-bin-dir", "cni-conf-dir", "state-dir", "ipam-dir"):
        args += [f"--{option}", str(root / option)]
    return [*args, "--dataplane", "fake"]


def wait_log(path: Path, process: subprocess.Popen[bytes], patterns: list[str]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not all(re.search(p, path.read_text(errors="replace"), re.M) for p in patterns):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"agent not ready:\n{path.read_text()[-3000:]}")
        time.sleep(0.2)


def one_agent(
    master: MasterProcess, work: Path, src: str | None, args: argparse.Namespace
) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(dir=work))
    kubeconfig = node_credentials(master.state_dir, NODE, master.server, root / "node.kubeconfig")
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    before = watchers(master)
    log = root / "agent.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            agent_command(root, kubeconfig), stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        wait_log(
            log,
            process,
            [
                rf"policy rules applied .*: {args.pods} pods",
                rf"services applied: {args.services} service ports, "
                rf"{args.services * args.endpoints} endpoints",
                r"DNS: pods listed",
            ],
        )
        time.sleep(QUIET)
        status = Path(f"/proc/{process.pid}/status").read_text()
        peak = next(
            int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM:")
        )
        now = watchers(master)
        opened = sum(now.get(k, 0) - before.get(k, 0) for k in now)
        return {"watches": opened, "rss": rss_mb(process.pid), "peak": peak}
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", required=True, help="src dir of the tree to compare with")
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-agent-watches-") as tmp:
        work = Path(tmp)
        etcd = start_etcd(work / "etcd")
        master = None
        try:
            master = launch_master(
                etcd, work / "master", "/bench/", "--network-plugin", "networkpolicy"
            )
            load(master, args.services, args.endpoints, args.pods)
            found: dict[str, list[dict[str, float]]] = {"baseline": [], "informers": []}
            for _ in range(args.runs):
                found["baseline"].append(one_agent(master, work, args.baseline_src, args))
                found["informers"].append(one_agent(master, work, None, args))
        finally:
            if master is not None:
                master.stop()
            etcd.stop(remove_data=True)
    print(
        f"agent, {args.services} services x {args.endpoints} endpoints, {args.pods} pods "
        f"(networkpolicy, DNS verified pod records), medians of {args.runs}:"
    )
    for name, runs in found.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(
            f"  {name:9s}: {med['watches']:.0f} watches at the master, RSS {med['rss']:.0f} MB "
            f"(peak {med['peak']:.0f} MB)"
        )


if __name__ == "__main__":
    main()
