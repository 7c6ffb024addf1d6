"""Flows in and out of a bridge: ``ovs-ofctl`` runs, ``ovs-vswitchd``'s control socket,
and an in-memory twin for unit tests.

``FlowRunner`` is what ``flowsync`` needs: replace a bridge's whole table (``ovs-ofctl``
dumps, diffs on its side and sends only the difference, so unchanged flows keep their
counters), apply one atomic bundle of ``delete cookie=C/-1`` and ``add`` lines, and dump
the flows. ``OfctlRunner`` pipes the text to ``ovs-ofctl -O OpenFlow13 --bundle`` (without
``-O OpenFlow13`` it cannot talk to a bridge that speaks only 1.3) with ``OVS_RUNDIR``
pointing at the node's instance, where the bridge's ``.mgmt`` socket is. ``appctl`` talks
JSON-RPC to ``ovs-vswitchd``'s unixctl socket directly (``ofproto/trace`` in well under a
millisecond, against ~12 ms for an ``ovs-appctl`` process).

Errors carry OVS's own message. A flow ``ovs-ofctl`` cannot parse or the switch refuses
is ``DataPlaneRejected`` (the bundle is rolled back whole; the same text fails again); a
switch that cannot be reached is ``DataPlaneError`` (transient).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Protocol

from podnet.dataplane.interface import DataPlaneError, DataPlaneRejected
from podnet.dataplane.ovs.daemons import VSWITCHD, OvsPaths, binary
from podnet.dataplane.ovs.flow import Flow

TIMEOUT = 30.0  # seconds for one ovs-ofctl run or unixctl call
# ovs-ofctl's words for input it refused: a line it cannot parse (``-:3: unknown action``)
# or an OpenFlow error from the switch (``Error OFPBAC_BAD_OUT_GROUP for: ...``)
_REFUSED = re.compile(r"ovs-ofctl: -:\d+: |Error OFP")


class FlowRunner(Protocol):
    """How ``FlowSync`` reaches a switch's flow tables."""

    async def replace_flows(self, bridge: str, text: str) -> None:
        """Make the flows of ``bridge`` exactly ``text`` (``add-flows`` lines), atomically."""

    async def bundle(self, bridge: str, text: str) -> None:
        """Apply ``delete cookie=C/-1`` and ``add ...`` lines as one atomic bundle."""

    async def dump_flows(self, bridge: str, match: str = "") -> str:
        """The flows of ``bridge`` (only those matching ``match``, e.g. ``table=253``),
        without counters, ports by number."""


class OfctlRunner:
    """The real runner: ``ovs-ofctl`` and the unixctl socket of the instance at ``paths``."""

    def __init__(self, paths: OvsPaths, timeout: float = TIMEOUT) -> None:
        self.paths, self.timeout = paths, timeout
        self._ofctl = binary("ovs-ofctl")

    async def replace_flows(self, bridge: str, text: str) -> None:
        await self._run(["--bundle", "replace-flows", bridge, "-"], text)

    async def bundle(self, bridge: str, text: str) -> None:
        await self._run(["--bundle", "add-flows", bridge, "-"], text)

    async def dump_flows(self, bridge: str, match: str = "") -> str:
        return await self._run(
            ["--no-stats", "--no-names", "dump-flows", bridge, *([match] if match else [])]
        )

    async def _run(self, args: list[str], stdin: str = "") -> str:
        argv = [self._ofctl, "-O", "OpenFlow13", *args]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.paths.env(),
            )
        except OSError as error:
            raise DataPlaneError(f"cannot run ovs-ofctl: {error}") from error
        try:
            out, err = await asyncio.wait_for(process.communicate(stdin.encode()), self.timeout)
        except TimeoutError as error:
            process.kill()
            await process.wait()
            raise DataPlaneError(f"ovs-ofctl {' '.join(args)} timed out") from error
        if process.returncode != 0:
            message = f"ovs-ofctl {' '.join(args)}: {err.decode(errors='replace').strip()}"
            raise (DataPlaneRejected if _REFUSED.search(message) else DataPlaneError)(message)
        return out.decode()

    async def appctl(self, command: str, *args: str) -> str:
        """Run unixctl ``command`` (``ofproto/trace``, ``bridge/dump-flows``...) in
        ``ovs-vswitchd``; its reply text. A command it refuses is ``DataPlaneRejected``."""
        socket = self.paths.unixctl(VSWITCHD)
        try:
            return await asyncio.wait_for(unixctl(str(socket), command, list(args)), self.timeout)
        except TimeoutError as error:
            raise DataPlaneError(f"{VSWITCHD} {command}: no reply in {self.timeout}s") from error


async def unixctl(socket: str, command: str, args: list[str]) -> str:
    """One JSON-RPC request on an OVS daemon's unixctl socket; its result text."""
    try:
        reader, writer = await asyncio.open_unix_connection(socket)
    except OSError as error:
        raise DataPlaneError(f"cannot reach {socket}: {error}") from error
    try:
        writer.write(json.dumps({"method": command, "params": args, "id": 0}).encode())
        await writer.drain()
        reply = await _json_message(reader, socket)
    finally:
        writer.close()
    if reply.get("error") is not None:
        raise DataPlaneRejected(f"{command} {' '.join(args)}: {str(reply['error']).strip()}")
    return str(reply.get("result", ""))


async def _json_message(reader: asyncio.StreamReader, socket: str) -> dict[str, object]:
    """Read until the bytes so far form one JSON object (the daemon sends no delimiter)."""
    buffer = ""
    decoder = json.JSONDecoder()
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            raise DataPlaneError(f"{socket} closed the connection before replying")
        buffer += chunk.decode(errors="replace")
        try:
            message, _ = decoder.raw_decode(buffer)
        except json.JSONDecodeError:
            continue
        if not isinstance(message, dict):
            raise DataPlaneError(f"{socket} sent {message!r}, not a JSON-RPC reply")
        return message


def dumped(flow: Flow) -> str:
    """``flow`` as ``dump-flows --no-stats`` shows it (roughly: the fake's dump)."""
    match = f",{flow.match}" if flow.match else ""
    return (
        f" cookie={flow.cookie:#x}, table={flow.table}, priority={flow.priority}{match}"
        f" actions={flow.actions}"
    )


def parse_flow(line: str) -> Flow:
    """``cookie=..,table=..,priority=..,<match> actions=...``; DataPlaneRejected if not."""
    head, found, actions = line.partition("actions=")
    if not found or not actions.strip():
        raise DataPlaneRejected(f"ovs-ofctl: -:1: no actions in {line!r}")
    numbers = {"cookie": 0, "table": 0, "priority": 32768}
    match = []
    for part in filter(None, (p.strip() for p in head.strip().split(","))):
        name, _, value = part.partition("=")
        if name in numbers:
            try:
                numbers[name] = int(value, 0)
            except ValueError as error:
                raise DataPlaneRejected(f"ovs-ofctl: -:1: bad {name} in {line!r}") from error
        else:
            match.append(part)
    return Flow(
        numbers["table"], numbers["priority"], ",".join(match), actions.strip(), numbers["cookie"]
    )


class FakeFlowRunner:
    """An in-memory switch for unit tests: applies replace, bundles (``delete cookie=C/-1``
    and ``add``) and dumps, atomically, and records every call in ``calls``. An action
    containing a word of ``refused`` is rejected as the switch would; ``reachable=False``
    plays a switch that is away; ``restart()`` plays a restarted ``ovs-vswitchd``."""

    def __init__(self, refused: tuple[str, ...] = ("group:",)) -> None:
        self.refused = refused
        self.reachable = True
        self.tables: dict[str, dict[tuple[int, int, str], Flow]] = {}
        self.calls: list[tuple[str, str, str]] = []

    def restart(self) -> None:
        self.tables.clear()

    def _check(self, op: str, bridge: str, text: str) -> dict[tuple[int, int, str], Flow]:
        if not self.reachable:
            raise DataPlaneError(f"ovs-ofctl {op}: {bridge} is not a bridge or a socket")
        self.calls.append((op, bridge, text))
        return dict(self.tables.get(bridge, {}))

    def _parsed(self, line: str) -> Flow:
        flow = parse_flow(line)
        if any(word in flow.actions for word in self.refused):
            raise DataPlaneRejected(f"Error OFPBAC_BAD_OUT_GROUP for: ADD {line}")
        return flow

    async def replace_flows(self, bridge: str, text: str) -> None:
        self._check("replace-flows", bridge, text)
        flows = [self._parsed(line) for line in text.splitlines() if line.strip()]
        self.tables[bridge] = {(f.table, f.priority, f.match): f for f in flows}

    async def bundle(self, bridge: str, text: str) -> None:
        table = self._check("bundle", bridge, text)
        for line in filter(str.strip, text.splitlines()):
            verb, _, rest = line.strip().partition(" ")
            if verb == "delete":
                value = rest.strip().removeprefix("cookie=").removesuffix("/-1")
                cookie = int(value, 0)
                table = {key: f for key, f in table.items() if f.cookie != cookie}
                continue
            flow = self._parsed(rest if verb == "add" else line)
            table[(flow.table, flow.priority, flow.match)] = flow
        self.tables[bridge] = table

    async def dump_flows(self, bridge: str, match: str = "") -> str:
        self._check("dump-flows", bridge, match)
        wanted = parse_flow(f"{match} actions=drop").table if match else None
        flows = sorted(self.tables.get(bridge, {}).values())
        return "".join(dumped(f) + "\n" for f in flows if wanted in (None, f.table))
