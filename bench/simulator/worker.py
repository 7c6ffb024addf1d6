"""A process running a share of the simulated agents, driven over stdin/stdout.

Run as ``python -m simulator.worker`` (``bench/`` on the path). The first stdin line is
the configuration (JSON): ``server``, ``ca`` (PEM), ``agents`` ([name, token, ip]),
``lease_seconds``, ``poll_seconds``, ``subnet_wait``. Each later line is a command;
each answer is one JSON line on stdout:

- ``{"cmd": "register", "deadline": s}``: every agent registers, starts its heartbeat,
  waits for its HostSubnet and marks its Node Ready -> ``{"event": "registered", ...}``
  when all are done or after ``deadline`` seconds.
- ``{"cmd": "join", "deadline": s}``: as ``register``, but each node first joins
  (``simulator.join``: the config then has ``ca_hash`` and ``state_dir``, each agent's
  ``token`` is its bootstrap token) and its agent runs on its client certificate; the
  answer also gives when each node had discovered the cluster and had its
  certificate (``joined_at``).
- ``{"cmd": "watch", "kinds": [...], "since": rv}``: every agent watches each kind from
  ``since`` (0: list first) -> ``{"event": "watching", ...}`` once every watch is open.
- ``{"cmd": "report"}`` -> ``{"event": "report", ...}``: the tally so far.
- ``{"cmd": "stop"}``: close everything -> ``{"event": "stopped"}``, and exit.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import json
import resource
import ssl
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from simulator.agent import POLL_SECONDS, AgentSpec, Failed, SimAgent, Tally
from simulator.join import join_node
from simulator.wire import Endpoint


def small_tls_buffers(size: int = 32 * 1024) -> None:
    """asyncio gives every TLS connection a ``SSLProtocol.max_size`` (256 KiB) read buffer:
    thousands of connections would cost gigabytes. A TLS record is at most 16 KiB."""
    asyncio.sslproto.SSLProtocol.max_size = size


WANTED_FILES = 65536  # 5,000 agents x (1 request + 5 watch connections), and spare


def raise_file_limit(wanted: int = WANTED_FILES) -> None:
    """Open-file limit up to ``wanted`` (each agent holds several sockets): the hard limit
    too where the process may raise it (root: up to fs.nr_open), else the soft one up to
    the hard one. The master and the workers, started after, inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            return
        except (ValueError, OSError):
            pass  # not allowed: the hard limit stays
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, wanted)), hard))


def endpoint_of(server: str, ca_pem: str) -> Endpoint:
    url = urlsplit(server)
    context = ssl.create_default_context(cadata=ca_pem)
    return Endpoint(url.hostname or "127.0.0.1", url.port or 443, context)


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Worker:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.tally = Tally()
        self.specs = [AgentSpec(*row) for row in config["agents"]]
        # Joining nodes (``ca_hash`` given) have no credentials yet: each one's agent is
        # made by ``join`` once its certificate is issued.
        endpoint = None if config.get("ca_hash") else endpoint_of(config["server"], config["ca"])
        self.agents = [] if endpoint is None else [self.agent(s, endpoint) for s in self.specs]
        self.tasks: list[asyncio.Task[Any]] = []

    def agent(self, spec: AgentSpec, endpoint: Endpoint) -> SimAgent:
        return SimAgent(
            spec,
            endpoint,
            self.tally,
            self.config.get("lease_seconds", 40),
            self.config.get("poll_seconds", POLL_SECONDS),
            self.config.get("subnet_wait", "watch"),
        )

    async def bring_up(self, agent: SimAgent, done: dict[str, float]) -> None:
        """Register, first heartbeat, HostSubnet, Ready: as ``podnet.agent`` starts."""
        await agent.register()
        await agent.renew_lease()
        self.tasks.append(asyncio.create_task(agent.heartbeat()))
        await agent.wait_for_subnet()
        await agent.set_ready()
        done[agent.spec.name] = time.monotonic()

    async def join_one(self, spec: AgentSpec, joined: dict[str, dict[str, float]]) -> SimAgent:
        """Node ``spec.name`` joins with its bootstrap token; its agent, on mTLS."""
        marks = joined[spec.name] = {}
        _, endpoint = await join_node(
            self.config["server"],
            self.config["ca_hash"],
            spec.name,
            spec.token,
            Path(self.config["state_dir"]) / spec.name,
            marks,
        )
        marks["certified"] = time.monotonic()
        agent = self.agent(AgentSpec(spec.name, "", spec.ip), endpoint)
        self.agents.append(agent)
        return agent

    async def register(self, deadline: float, joining: bool = False) -> dict[str, Any]:
        """Start every agent (``joining``: each node joins first); answer when all are
        Ready or after ``deadline`` seconds (``unfinished`` then counts the agents still
        waiting; they keep trying)."""
        started = time.monotonic()
        done: dict[str, float] = {}
        joined: dict[str, dict[str, float]] = {}
        failures: list[str] = []

        async def one(spec: AgentSpec, agent: SimAgent | None) -> None:
            try:
                agent = agent or await self.join_one(spec, joined)
                await self.bring_up(agent, done)
            except Failed as exc:
                failures.append(str(exc))
            except Exception as exc:  # a timeout or a broken connection: a failure too
                failures.append(f"{spec.name} {type(exc).__name__}: {exc}"[:200])

        pairs = zip(self.specs, [None] * len(self.specs) if joining else self.agents, strict=True)
        starting = [asyncio.create_task(one(s, a)) for s, a in pairs]
        self.tasks.extend(starting)
        _, unfinished = await asyncio.wait(starting, timeout=deadline)
        return {
            "event": "registered",
            "started": started,
            "done": list(done.values()),
            "ready_at": done,
            "joined_at": joined,
            "failures": failures[:20],
            "failed": len(failures),
            "unfinished": len(unfinished),
            "subnets": {a.spec.name: a.subnet for a in self.agents},
        }

    async def watch(self, kinds: list[str], since: int) -> dict[str, Any]:
        started = time.monotonic()
        opened: list[asyncio.Event] = []
        for agent in self.agents:
            for plural in kinds:
                event = asyncio.Event()
                opened.append(event)
                self.tasks.append(asyncio.create_task(agent.watch(plural, since, event)))
        await asyncio.gather(*(e.wait() for e in opened))
        return {"event": "watching", "opened": len(opened), "seconds": time.monotonic() - started}

    def report(self) -> dict[str, Any]:
        tally = self.tally
        kinds = sorted({k for a in self.agents for k in a.counts})
        return {
            "event": "report",
            "per_version": [[v, *e] for v, e in sorted(tally.per_version.items())],
            "counts": {k: [a.counts.get(k, 0) for a in self.agents] for k in kinds},
            "opened": {a.spec.name: a.opened for a in self.agents},
            "expired": tally.expired,
            "reconnects": tally.reconnects,
            "errors": tally.errors,
            "retries": tally.retries,
            "heartbeats": tally.heartbeats,
        }

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.gather(*(a.close() for a in self.agents), return_exceptions=True)


async def serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    worker = Worker(json.loads(await reader.readline()))
    emit({"event": "started", "agents": len(worker.agents)})
    pending: set[asyncio.Task[None]] = set()

    async def run(command: dict[str, Any]) -> None:
        if command["cmd"] in ("register", "join"):
            deadline = float(command.get("deadline", 600))
            emit(await worker.register(deadline, joining=command["cmd"] == "join"))
        elif command["cmd"] == "watch":
            emit(await worker.watch(command["kinds"], int(command.get("since", 0))))
        elif command["cmd"] == "report":
            emit(worker.report())

    while line := await reader.readline():
        command = json.loads(line)
        if command["cmd"] == "stop":
            break
        task = asyncio.create_task(run(command))
        pending.add(task)
        task.add_done_callback(pending.discard)
    for task in list(pending):
        task.cancel()
    await worker.stop()
    emit({"event": "stopped"})


def main() -> None:
    raise_file_limit()
    small_tls_buffers()
    asyncio.run(serve())


if __name__ == "__main__":
    main()
