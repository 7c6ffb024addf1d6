"""`podnet adm join node` -> the node Ready, on hand-made hosts (issue 20's goal: < 10 s).

Run: .venv/bin/python bench/bench_join.py [--nodes 5]

Host m1 runs `podnet adm init` and its units (etcd on TLS, the master) by their ExecStart
lines; then, one after another, ``--nodes`` fresh hosts each get a bootstrap token bound
to them (`podnet adm token create --node`) and run `podnet adm join node` as documented,
then their relay and node units. Measured: from the join command's start to the Node's
Ready condition as the master shows it (polled every 0.2 s), and the join command alone
(discovery, key, CSR approved and signed). Everything runs in namespaces the benchmark
makes (``podnet.testing.hosts``) and is removed at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from podnet.api.clusterinfo import ca_cert_hash
from podnet.testing.hosts import Host, Hosts

BIN = str(Path(sys.executable).parent)
PATH = {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin"}
MASTER_DIR = "/var/lib/podnet/master"
GOAL = 10.0
READY = (
    'import json,sys; c=json.load(sys.stdin)["status"].get("conditions") or []; '
    'sys.exit(0 if any(x["type"]=="Ready" and x["status"]=="True" for x in c) else 1)'
)


def first_master(m1: Host) -> str:
    m1.sh("podnet adm init --advertise-address 10.0.0.21", PATH)
    for unit in ("podnet-etcd.service", "podnet-master.service"):
        m1.start_unit(unit, BIN)
    m1.wait_until("curl -skf https://10.0.0.21:6443/readyz >/dev/null", 60, "master", PATH)
    return ca_cert_hash(m1.sh(f"cat {MASTER_DIR}/pki/ca.crt").stdout.encode())


def join(m1: Host, node: Host, ca_hash: str) -> tuple[float, float]:
    token = m1.sh(f"podnet adm token create --node {node.name}", PATH).stdout.strip()
    command = "podnet adm join node --server https://10.0.0.21:6443 "
    command += f"--token {token} --ca-cert-hash {ca_hash}"
    started = time.monotonic()
    node.sh(command, PATH)
    joined = time.monotonic() - started
    for unit in ("podnet-api-relay.service", "podnet-node.service"):
        node.start_unit(unit, BIN)
    env = {**PATH, "KUBECONFIG": f"{MASTER_DIR}/admin.kubeconfig"}
    check = f"podnet get node {node.name} -o json 2>/dev/null | python3 -c '{READY}'"
    m1.wait_until(check, 60, f"{node.name} Ready", env)
    return joined, time.monotonic() - started


def main(args: argparse.Namespace) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="podnet-bench-join-") as scratch,
        Hosts(f"pb{uuid.uuid4().hex[:6]}", Path(scratch)) as hosts,
    ):
        m1 = hosts.add("m1", 21)
        ca_hash = first_master(m1)
        commands, ready = [], []
        for i in range(args.nodes):
            node = hosts.add(f"n{i + 1}", 31 + i)
            joined, total = join(m1, node, ca_hash)
            commands.append(joined)
            ready.append(total)
            print(f"  n{i + 1}: join command {joined:.1f} s, Ready after {total:.1f} s")
    print(f"== adm join node -> Ready, {args.nodes} hosts one after another")
    print(f"  median {statistics.median(ready):.1f} s, max {max(ready):.1f} s (goal: < {GOAL} s)")
    print(f"  the join command alone: median {statistics.median(commands):.1f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5)
    main(parser.parse_args())
