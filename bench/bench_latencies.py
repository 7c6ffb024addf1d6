"""Small latencies that tests used to assert on the wall clock; they are measured here.

Run: .venv/bin/python bench/bench_latencies.py [--only shim,subnets,cni,attach] [--runs 20]

- shim: the CNI plugin answering VERSION, as a process per call as a runtime runs it:
  ``python -I -S shim.py``, the installed launcher and the C shim (the C shim is the
  claim: it must start faster than Python).
- subnets: 1,000 next-fit allocations in a /8 of /24s, and the worst case of a full
  /14 of /24s with only the slot behind the cursor free (claims: under 1 s, and 0.5 s).
- cni: in-process CNI ADD and DEL through the agent's CniServer.answer over the fake data
  plane and the real host-local store (claim: medians under 10 ms each).
- attach: the linux data plane attaching and detaching a pod in a lab of network
  namespaces (needs root; claims: medians under 100 ms and 200 ms).

Each line prints the figures and the claim with ok/MISSED; the exit status is 1 when a
claim is missed. Everything made (temporary dirs, namespaces) is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

import podnet.cni
from podnet.agent.cniserver import CniServer
from podnet.agent.pods import PodManager
from podnet.cni import build
from podnet.cni.types import CniRequest, parse_request
from podnet.controllers.config import parse_cluster_network_flag
from podnet.controllers.subnets import SubnetAllocator
from podnet.dataplane.fake import FakeDataPlane
from podnet.dataplane.interface import NodeNetwork
from podnet.ipam.hostlocal import HostLocalStore
from podnet.testing.lab import Lab, up

SHIM_PY = Path(podnet.cni.__file__).resolve().parent / "shim.py"
missed: list[str] = []


def claim(what: str, value_ms: float, limit_ms: float) -> None:
    ok = value_ms < limit_ms
    print(f"  {what}: {value_ms:.2f} ms (claim < {limit_ms:g} ms: {'ok' if ok else 'MISSED'})")
    if not ok:
        missed.append(what)


def timed_ms(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def shim_start(runs: int, work: Path) -> None:
    print(f"CNI plugin answering VERSION, a process per call, median of {runs}:")
    c_shim = work / "c" / "podnet"
    if not build.build_c_shim(c_shim):
        sys.exit("gcc is required for the C shim: install it with scripts/setup.sh")
    launcher = build.install_shim(work / "launcher", sys.executable, prefer_c=False)
    commands = {
        "python -I -S shim.py": [sys.executable, "-I", "-S", str(SHIM_PY)],
        "installed launcher": [str(launcher)],
        "C shim": [str(c_shim)],
    }
    medians = {}
    for label, cmd in commands.items():
        medians[label] = statistics.median(
            timed_ms(lambda cmd=cmd: subprocess.run(cmd, **VERSION_CALL)) for _ in range(runs)
        )
        print(f"  {label}: {medians[label]:.1f} ms")
    python = medians["python -I -S shim.py"]
    claim("C shim (the limit is the Python shim's median)", medians["C shim"], python)


VERSION_CALL: dict[str, Any] = {
    "input": b'{"cniVersion": "1.1.0"}',
    "env": {"CNI_COMMAND": "VERSION"},
    "capture_output": True,
    "check": True,
}


def subnets() -> None:
    print("Subnet allocation (next-fit, slots never materialised):")
    wide = SubnetAllocator([parse_cluster_network_flag("10.0.0.0/8:8")])
    took = timed_ms(lambda: [wide.allocate() for _ in range(1000)])
    claim("1,000 allocations in a /8 of /24s", took, 1000)
    full = SubnetAllocator([parse_cluster_network_flag("10.0.0.0/14:8")])
    nets = [full.allocate() for _ in range(full.total)]
    full.release(nets[0])
    claim("one allocation in a full /14 of /24s, one slot free", timed_ms(full.allocate), 500)


def request(command: str, cid: str) -> CniRequest:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": "eth0"}
    env |= {"CNI_NETNS": "/var/run/netns/p", "CNI_ARGS": f"K8S_POD_NAME={cid}"}
    config = json.dumps({"cniVersion": "1.0.0", "name": "podnet", "type": "podnet"})
    return parse_request(json.dumps({"env": env, "config": config}))


async def cni_in_process(runs: int, work: Path) -> None:
    print(f"In-process CNI through CniServer.answer (fake data plane), median of {runs}:")
    node = NodeNetwork(
        "node-a",
        IPv4Address("192.0.2.10"),
        IPv4Network("10.128.0.0/23"),
        (IPv4Network("10.128.0.0/14"),),
        IPv4Network("172.30.0.0/16"),
        1450,
    )
    dataplane = FakeDataPlane()
    await dataplane.setup_node(node)
    manager = PodManager(dataplane, HostLocalStore(work / "ipam", "podnet"), node)
    manager.ready = True
    server = CniServer(work / "unused.sock", manager)
    for warm in range(runs):  # the store's files and the code paths warmed up first
        await server.answer(request("ADD", f"w{warm}"))
        await server.answer(request("DEL", f"w{warm}"))
    timings: dict[str, list[float]] = {"ADD": [], "DEL": []}
    for command in ("ADD", "DEL"):
        for i in range(runs):
            started = time.perf_counter()
            status, body = await server.answer(request(command, f"c{i}"))
            timings[command].append((time.perf_counter() - started) * 1000)
            if status != 200:
                sys.exit(f"{command} c{i} answered {status}: {body!r}")
    for command, limit in (("ADD", 10), ("DEL", 10)):
        claim(f"{command} median", statistics.median(timings[command]), limit)


async def linux_attach(runs: int) -> None:
    print(f"Linux data plane in a lab of namespaces, median of {runs}:")
    if os.geteuid() != 0:
        sys.exit("the attach benchmark needs root (network namespaces)")
    lab = Lab(f"pnb-{os.getpid()}-{uuid.uuid4().hex[:4]}")
    try:
        lab.build()
        plane = (await up(lab, [1]))[1]
        pods = [lab.pod(1, 10 + k, f"t{k}")[1] for k in range(runs)]
        attach = [await timed_async(plane.attach_pod(pod)) for pod in pods]
        detach = [
            await timed_async(plane.detach_pod(pod.container_id, pod.ifname, pod.netns))
            for pod in pods
        ]
        claim("attach median", statistics.median(attach), 100)
        claim("detach median", statistics.median(detach), 200)
    finally:
        await lab.close()


async def timed_async(action: Awaitable[object]) -> float:
    started = time.perf_counter()
    await action
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="shim,subnets,cni,attach")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    only = set(args.only.split(","))
    work = Path(tempfile.mkdtemp(prefix="pn-bench-"))
    try:
        if "shim" in only:
            shim_start(args.runs, work)
        if "subnets" in only:
            subnets()
        if "cni" in only:
            asyncio.run(cni_in_process(max(args.runs, 100), work))
        if "attach" in only:
            asyncio.run(linux_attach(min(args.runs, 30)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if missed:
        sys.exit(f"missed: {', '.join(missed)}")


if __name__ == "__main__":
    main()
