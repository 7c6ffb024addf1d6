"""The driver's side of the simulator: node tokens, worker processes, their answers.

Every simulated node gets its own token (user ``system:node:<name>``, group
``system:nodes``), written to the master's token file in one go before the agents start
(``podnet.api.auth.ensure_node_token`` rewrites the whole file per node, which is fine for
one node and quadratic for 5,000). Agents are spread over worker processes, each one
asyncio loop; the driver talks to each over its stdin/stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import os
import secrets
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podnet.api.identity import NODES_GROUP, node_user

BENCH_DIR = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def node_names(count: int) -> list[str]:
    return [f"sim-{i:05d}" for i in range(count)]


def node_ip(index: int) -> str:
    """A distinct InternalIP per node, from 100.64.0.0/10 (never routed: data only)."""
    return f"100.{64 + index // 65024}.{index // 254 % 256}.{index % 254 + 1}"


def write_node_tokens(path: Path, names: list[str]) -> dict[str, str]:
    """Append one token row per node to a token file (created 0600); name -> token."""
    tokens = {name: secrets.token_urlsafe(24) for name in names}
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        for name, token in tokens.items():
            writer.writerow([token, node_user(name), str(uuid.uuid4()), NODES_GROUP])
    return tokens


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class WorkerProcess:
    process: asyncio.subprocess.Process
    answers: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        await self.process.stdin.drain()

    async def pump(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            await self.answers.put(json.loads(line))
        await self.answers.put({"event": "exited", "code": await self.process.wait()})

    async def answer(self, event: str, timeout: float) -> dict[str, Any]:
        message = await asyncio.wait_for(self.answers.get(), timeout)
        if message.get("event") != event:
            raise RuntimeError(f"worker {self.pid}: wanted {event}, got {message}")
        return message


class Fleet:
    """Simulated agents spread over ``workers`` processes."""

    def __init__(self, server: str, ca_pem: bytes, tokens: dict[str, str], log_dir: Path):
        self.server = server
        self.ca = ca_pem.decode()
        self.names = list(tokens)
        self.tokens = tokens
        self.log_dir = log_dir
        self.workers: list[WorkerProcess] = []
        self._pumps: list[asyncio.Task[None]] = []

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    async def start(
        self,
        workers: int,
        lease_seconds: int = 40,
        poll_seconds: float = 0.5,
        subnet_wait: str = "watch",
        join: dict[str, str] | None = None,
    ) -> None:
        """``join``: the nodes join first (``ca_hash``, ``state_dir``; see
        ``simulator.join``), their tokens being bootstrap tokens, and the fleet's CA
        unused (each node discovers it)."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH_DIR), *sys.path])}
        for index in range(workers):
            rows = [
                [name, self.tokens[name], node_ip(i)]
                for i, name in enumerate(self.names)
                if i % workers == index
            ]
            log = open(self.log_dir / f"sim-worker-{index}.log", "wb")  # noqa: SIM115
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "simulator.worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=env,
                limit=1 << 28,
            )
            log.close()
            worker = WorkerProcess(process)
            self.workers.append(worker)
            self._pumps.append(asyncio.create_task(worker.pump()))
            config = {"server": self.server, "ca": self.ca, "agents": rows}
            await worker.send(
                config
                | {
                    "lease_seconds": lease_seconds,
                    "poll_seconds": poll_seconds,
                    "subnet_wait": subnet_wait,
                }
                | (join or {})
            )
        for worker in self.workers:
            await worker.answer("started", 60)

    async def ask(self, command: dict[str, Any], event: str, timeout: float) -> list[Any]:
        """Send ``command`` to every worker; their answers, in worker order."""
        for worker in self.workers:
            await worker.send(command)
        return [await w.answer(event, timeout) for w in self.workers]

    async def stop(self) -> None:
        """Ask each worker to stop; kill (by PID) one that does not within 30 s."""
        for worker in self.workers:
            if worker.process.returncode is None:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    await worker.send({"cmd": "stop"})
        for worker in self.workers:
            try:
                await asyncio.wait_for(worker.process.wait(), 30)
            except TimeoutError:
                worker.process.kill()
                await worker.process.wait()
        for pump in self._pumps:
            pump.cancel()
