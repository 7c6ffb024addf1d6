"""Apply a desired list of flows to a bridge: whole on start, then by changed group only.

Flows are grouped by cookie (one group per object: a pod, a policy, a remote node...).
``FlowSync`` remembers the groups it applied last:

- On its first sync (the agent just started), after ``forget()`` (``ovs-vswitchd`` was
  restarted and lost every flow), or after a failure that leaves the switch's state
  unknown, it replaces the bridge's whole table with ``replace-flows``. ``ovs-ofctl``
  diffs on its side and sends only the difference, so a restarted agent that finds the
  right flows changes nothing (no flush, counters kept).
- Otherwise each sync sends ONE atomic bundle: ``delete cookie=C/-1`` plus the new flows
  of each group that was added, removed or changed. Nothing else moves.

The version note (``Kind.NOTE``, table ``NOTE``) is written last, only after the rest
succeeded: a replace keeps the note it finds, and a second bundle then writes the new
one. A table whose note is right is therefore complete. OVS pads a note to 6 + 8k bytes
and reads it back padded, so ``note_flow`` pads it the same way (else every start would
rewrite it). Every text sent is deterministic (groups and flows in sorted order).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from podnet.dataplane.interface import DataPlaneRejected
from podnet.dataplane.ovs import tables
from podnet.dataplane.ovs.flow import Flow, Kind, cookie, flows_text
from podnet.dataplane.ovs.ofctl import FlowRunner, parse_flow

log = logging.getLogger(__name__)

Groups = dict[int, tuple[Flow, ...]]  # cookie -> the group's flows, sorted


def note_flow(data: bytes) -> Flow:
    """The version note flow carrying ``data``, padded as OVS pads it (6 + 8k bytes)."""
    padded = data + bytes(-(len(data) - 6) % 8 if len(data) > 6 else 6 - len(data))
    return Flow(
        tables.NOTE, 0, "", "note:" + ".".join(f"{b:02x}" for b in padded), cookie(Kind.NOTE, "")
    )


def group(flows: Iterable[Flow]) -> Groups:
    """The flows by cookie; DataPlaneRejected for cookie 0 (filtering on it also lists
    OVS's hidden flows) or for two flows with one table, priority and match (the second
    would silently replace the first on the switch)."""
    groups: dict[int, list[Flow]] = {}
    seen: dict[tuple[int, int, str], Flow] = {}
    for flow in flows:
        if flow.cookie == 0:
            raise DataPlaneRejected(f"flow without a cookie: {flow.text()}")
        key = (flow.table, flow.priority, flow.match)
        if key in seen:
            raise DataPlaneRejected(f"two flows match alike: {seen[key].text()} / {flow.text()}")
        seen[key] = flow
        groups.setdefault(flow.cookie, []).append(flow)
    return {c: tuple(sorted(fs)) for c, fs in groups.items()}


def is_note(value: int) -> bool:
    return value >> 56 == Kind.NOTE


def bundle_text(old: Mapping[int, object], new: Groups, cookies: Iterable[int]) -> str:
    """``delete cookie=C/-1`` (for groups there before) and ``add`` lines for ``cookies``."""
    lines = []
    for value in sorted(cookies):
        if value in old:
            lines.append(f"delete cookie={value:#x}/-1\n")
        lines.extend(f"add {flow.text()}\n" for flow in new.get(value, ()))
    return "".join(lines)


def same_flows(dumped: str, flows: Iterable[Flow]) -> bool:
    """Whether ``dump-flows`` text shows exactly ``flows`` (compared field by field)."""
    return sorted(parse_flow(line) for line in dumped.splitlines() if line.strip()) == sorted(flows)


@dataclass(frozen=True)
class SyncResult:
    """What one sync did: ``replace`` (the whole table), ``bundle`` or ``none``, and the
    cookies of the groups it sent (all of them for a replace)."""

    mode: str
    groups: int = 0


class FlowSync:
    """Keeps ``bridge``'s flows equal to the last groups given to ``sync_groups`` (or the
    last list given to ``sync``). A sync costs what changed: a group given as the very
    object of the last sync is taken as unchanged without a look inside, any other is
    sorted and compared; the check that no two flows match alike is kept by an index of
    the applied flows, updated for the changed groups only."""

    def __init__(self, runner: FlowRunner, bridge: str = tables.BRIDGE) -> None:
        self.runner, self.bridge = runner, bridge
        self._applied: Groups | None = None  # None: what the switch holds is unknown
        self._given: dict[int, Sequence[Flow]] = {}  # cookie -> the object last given
        self._keys: dict[_Key, int] = {}  # (table, priority, match) -> cookie, applied
        self._lock = asyncio.Lock()

    def forget(self) -> None:
        """The switch lost or may have lost its flows (``ovs-vswitchd`` restarted): the
        next sync replaces the whole table."""
        self._applied = None

    async def note_ok(self, flows: Iterable[Flow]) -> bool:
        """Whether the note read back from the switch is the one in ``flows``."""
        note = [f for f in flows if is_note(f.cookie)]
        return same_flows(await self._dump_note(), note)

    async def sync(self, flows: Iterable[Flow]) -> SyncResult:
        """``sync_groups`` of ``flows`` grouped by cookie."""
        return await self.sync_groups(group(flows))

    async def sync_groups(self, groups: Mapping[int, Sequence[Flow]]) -> SyncResult:
        """Make the bridge's flows those of ``groups`` (cookie -> flows): a replace the
        first time (see the module), else one bundle of the changed groups, then the note
        if it changed. DataPlaneRejected, changing nothing, for a flow without a cookie
        or two flows matching alike."""
        async with self._lock:
            old = self._applied
            known = {} if old is None else old
            changed = self._changed(known, groups, everything=old is None)
            self._check(known, changed, {} if old is None else self._keys)
            self._applied = None  # unknown until this sync succeeds
            try:
                if old is None:
                    result = await self._replace(changed)
                else:
                    result = await self._bundle(old, changed)
            except DataPlaneRejected:
                self._applied = old  # a refused bundle is rolled back whole
                raise
            self._applied = self._applied_after(known, changed, everything=old is None)
            self._given = {c: fs for c, fs in groups.items() if c in self._applied}
            return result

    def _changed(
        self, old: Groups, groups: Mapping[int, Sequence[Flow]], everything: bool
    ) -> Groups:
        """Cookie -> sorted flows of each group that differs from ``old`` (empty: gone);
        every group when ``everything``."""
        given, changed = self._given, {}
        for value, flows in groups.items():
            if not everything and given.get(value) is flows:
                continue
            sorted_flows = tuple(sorted(flows))
            if everything or old.get(value, ()) != sorted_flows:
                changed[value] = sorted_flows
        if not everything:
            changed.update((value, ()) for value in old.keys() - groups.keys())
        return {c: fs for c, fs in changed.items() if fs or c in old}

    @staticmethod
    def _check(old: Groups, changed: Groups, keys: Mapping[_Key, int]) -> None:
        """DataPlaneRejected for cookie 0 or two flows matching alike in what the table
        would hold after ``changed`` (``keys``: the index of ``old``)."""
        claimed: dict[_Key, Flow] = {}
        for value, flows in changed.items():
            for flow in flows:
                if value == 0:
                    raise DataPlaneRejected(f"flow without a cookie: {flow.text()}")
                key = (flow.table, flow.priority, flow.match)
                holder = keys.get(key)
                other = claimed.get(key)
                if other is None and holder is not None and holder not in changed:
                    other = next(f for f in old[holder] if _key(f) == key)
                if other is not None:
                    raise DataPlaneRejected(
                        f"two flows match alike: {other.text()} / {flow.text()}"
                    )
                claimed[key] = flow

    def _applied_after(self, old: Groups, changed: Groups, everything: bool) -> Groups:
        """The applied groups once ``changed`` is on the switch; the index follows."""
        if everything:
            self._keys = {}
            applied: Groups = {}
        else:
            applied = old
            for value in changed:
                for flow in applied.pop(value, ()):
                    if self._keys.get(_key(flow)) == value:
                        del self._keys[_key(flow)]
        for value, flows in changed.items():
            if flows:
                applied[value] = flows
                self._keys.update((_key(flow), value) for flow in flows)
        return applied

    async def _dump_note(self) -> str:
        return await self.runner.dump_flows(self.bridge, f"table={tables.NOTE}")

    async def _replace(self, new: Groups) -> SyncResult:
        notes = [f for c, fs in new.items() if is_note(c) for f in fs]
        found = await self._dump_note()
        if same_flows(found, notes):
            await self.runner.replace_flows(self.bridge, flows_text(_flat(new)))
            return SyncResult("replace", len(new))
        # the rest first, keeping the note as found; the new note only once that worked
        rest = [f for c, fs in new.items() if not is_note(c) for f in fs]
        await self.runner.replace_flows(self.bridge, flows_text(rest) + found)
        stale = {parse_flow(line).cookie: () for line in found.splitlines() if line.strip()}
        note_groups = {c: fs for c, fs in new.items() if is_note(c)}
        await self.runner.bundle(
            self.bridge, bundle_text(stale, note_groups, {*stale, *note_groups})
        )
        log.info("%s: flows replaced, note written", self.bridge)
        return SyncResult("replace", len(new))

    async def _bundle(self, old: Groups, changed: Groups) -> SyncResult:
        rest = sorted(c for c in changed if not is_note(c))
        notes = sorted(c for c in changed if is_note(c))
        if rest:
            await self.runner.bundle(self.bridge, bundle_text(old, changed, rest))
        if notes:
            await self.runner.bundle(self.bridge, bundle_text(old, changed, notes))
        return SyncResult("bundle" if changed else "none", len(changed))


_Key = tuple[int, int, str]


def _key(flow: Flow) -> _Key:
    return flow.table, flow.priority, flow.match


def _flat(groups: Groups) -> list[Flow]:
    return [flow for flows in groups.values() for flow in flows]
