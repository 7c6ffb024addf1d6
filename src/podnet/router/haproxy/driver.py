"""The router's HAProxy driver: takes ``RouterTable`` updates and makes HAProxy serve them.

``update`` only records the newest table; one task applies it. A change of servers only
goes to the running worker over the runtime API (and into the live ``haproxy.cfg``, so a
later reload agrees); anything else writes and checks a new generation and reloads. A
reload begins no sooner than ``reload_interval`` after the last one began, and the task
takes the newest table each time, so a burst of updates becomes one reload; an update
that changes nothing does nothing. A generation HAProxy
refuses is kept aside with the error, and the live one goes on serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podnet.files import write_atomic
from podnet.router.haproxy import plan as planning
from podnet.router.haproxy.config import render_config
from podnet.router.haproxy.generations import ConfigRejected, GenerationStore
from podnet.router.haproxy.master import HAProxyMaster, ReloadFailed
from podnet.router.haproxy.render import Generation, render
from podnet.router.haproxy.runtimeapi import RuntimeAPIError
from podnet.router.haproxy.settings import HAProxySettings
from podnet.router.haproxy.stats import BackendStats, StatsTotals, parse_show_stat
from podnet.router.table import RouterTable

log = logging.getLogger(__name__)
WATCH_INTERVAL = 2.0  # seconds between checks of HAProxy and of servers left draining


@dataclass(frozen=True)
class DriverCounters:
    """What the driver has done, for metrics."""

    reloads: int = 0
    last_reload_seconds: float = 0.0
    runtime_updates: int = 0  # updates applied without a reload
    rejected: int = 0  # generations refused by ``haproxy -c`` or by the reload
    last_error: str = ""
    applied: int = 0  # the last update number applied (or refused)
    restarts: int = 0  # HAProxy masters started again after they died


def cookie_secret(settings: HAProxySettings) -> str:
    """The settings' cookie key, else one kept in the run dir (made once, mode 600)."""
    if settings.cookie_secret:
        return settings.cookie_secret
    path = settings.run_dir / "cookie-secret"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        secret = secrets.token_hex(16)
        write_atomic(path, secret + "\n", 0o600)
        return secret


def keep_server_states(text: str) -> str:
    """``show servers state`` without the servers put in maintenance by the runtime API
    (removed ones left draining): a later config that has them again starts them ready."""
    kept = []
    for line in text.splitlines():
        fields = line.split()
        forced_maint = len(fields) > 6 and fields[6].isdigit() and int(fields[6]) & 0x01
        if line.strip() and not forced_maint:
            kept.append(line)
    return "\n".join(kept) + "\n"


class HAProxyRouter:
    """Drives one HAProxy (master-worker) from ``RouterTable`` updates."""

    def __init__(self, settings: HAProxySettings) -> None:
        self.settings = settings
        self.master = HAProxyMaster(settings)
        self._store: GenerationStore | None = None
        self._secret = ""
        self._live: RouterTable | None = None
        self._desired = RouterTable()
        self._requested = self._done = 0
        self._counters = DriverCounters()
        self._wake = asyncio.Event()
        self._settled = asyncio.Condition()
        self._draining: set[str] = set()  # "<backend>/<server>" in maint, not yet deleted
        self._task: asyncio.Task[None] | None = None
        self._totals = StatsTotals()
        self._stats_read = False
        self._last_reload = -float("inf")  # when the last reload began (monotonic)

    @property
    def counters(self) -> DriverCounters:
        return self._counters

    @property
    def live_table(self) -> RouterTable | None:
        """The table HAProxy serves now."""
        return self._live

    async def start(self, table: RouterTable | None = None) -> None:
        """Write ``table`` (default: no routes), start HAProxy (or adopt the one an
        earlier router left running, and reload it) and begin taking updates.
        Raises ``ConfigRejected`` if HAProxy refuses the first generation."""
        await self._open_store()
        self._desired = table or RouterTable()
        await self._write_checked(self._desired)
        if await self.master.start():
            await self._reload()
        self._live = self._desired
        self._task = asyncio.create_task(self._run(), name="haproxy-driver")

    async def check(self, table: RouterTable) -> None:
        """Have HAProxy check ``table``'s generation (``haproxy -c``) without serving it;
        ``ConfigRejected`` with HAProxy's words if refused. Usable before ``start``."""
        store = await self._open_store()
        directory, _ = await self._write(table, scratch=True)
        try:
            await asyncio.to_thread(store.check, directory)
        finally:
            await asyncio.to_thread(store.discard, directory)

    async def _open_store(self) -> GenerationStore:
        if self._store is None:
            self._store = await asyncio.to_thread(GenerationStore, self.settings)
            self._secret = cookie_secret(self.settings)
        return self._store

    def update(self, table: RouterTable) -> int:
        """Ask for ``table`` to be served; returns the update's number (see ``settled``)."""
        self._desired = table
        self._requested += 1
        self._wake.set()
        return self._requested

    async def settled(self, update: int | None = None) -> DriverCounters:
        """Wait until update ``update`` (default: the latest) is applied or refused."""
        target = self._requested if update is None else update
        async with self._settled:
            await self._settled.wait_for(lambda: self._done >= target)
        return self._counters

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking updates and stop HAProxy, giving its connections ``grace`` seconds
        (default: ``hard_stop_after`` and 5 s) before it is terminated."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.master.stop(grace)

    async def backend_stats(self) -> dict[str, BackendStats]:
        """Requests and errors per route backend, summed over reloads."""
        worker = self.master.worker
        if worker is None:
            return {}
        self._stats_read = True
        current = parse_show_stat(await self.master.cli.to_worker(worker, "show stat"))
        return self._totals.add(worker, current)

    async def _keep_counts(self) -> None:
        """Before a reload, fold in what the worker counted since the last read (once
        anyone reads the counters): the new worker starts from zero."""
        if not self._stats_read:
            return
        try:
            await self.backend_stats()
        except (RuntimeAPIError, OSError, TimeoutError) as error:
            log.warning("router: could not read counters before the reload: %s", error)

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), WATCH_INTERVAL)
            except TimeoutError:
                await self._watch()
                continue
            self._wake.clear()
            if not self.master.running():
                await self._watch()
            number, table = self._requested, self._desired
            try:
                await self._apply(table)
            except Exception as error:  # keep serving the last table; try again soon
                log.exception("router: applying the table failed")
                self._record(last_error=f"{type(error).__name__}: {error}")
                asyncio.get_running_loop().call_later(WATCH_INTERVAL, self._wake.set)
            async with self._settled:
                self._done = number
                self._record(applied=number)
                self._settled.notify_all()

    async def _watch(self) -> None:
        """Between updates: delete drained servers; start HAProxy again if it died."""
        try:
            if self.master.running():
                await self._delete_drained()
                return
            log.error("router: HAProxy's master exited; starting it again")
            self._draining.clear()
            await self._write_checked(self._live or RouterTable())
            await self.master.start()
            self._record(restarts=self._counters.restarts + 1)
        except Exception as error:  # tried again at the next watch
            log.exception("router: watching HAProxy failed")
            self._record(last_error=f"{type(error).__name__}: {error}")

    def _record(self, **changes: Any) -> None:
        self._counters = dataclasses.replace(self._counters, **changes)

    async def _write(self, table: RouterTable, scratch: bool = False) -> tuple[Path, Generation]:
        """Render and write ``table``'s generation (in a thread: 10,000 routes take a
        second); not yet live."""
        assert self._store is not None
        generation = await asyncio.to_thread(render, table, self.settings, self._secret)
        directory = await asyncio.to_thread(self._store.write, generation, scratch)
        return directory, generation

    async def _write_checked(self, table: RouterTable) -> None:
        assert self._store is not None
        store = self._store
        directory, generation = await self._write(table)
        try:
            await asyncio.to_thread(store.check, directory)
        except ConfigRejected as error:
            await asyncio.to_thread(store.reject, directory, str(error))
            raise
        store.activate(directory, generation)

    async def _apply(self, table: RouterTable) -> None:
        """Serve ``table``: nothing, runtime commands, or a checked generation and a
        reload (no sooner than ``reload_interval`` after the last one began: updates that
        come meanwhile wait for the next)."""
        plan = planning.plan_update(self._live, table)
        if plan.unchanged:
            await self._delete_drained()
            return
        if not plan.reload:
            assert self._store is not None
            try:
                await self._run_changes(plan.changes)
            except (RuntimeAPIError, OSError, TimeoutError) as error:
                log.warning("router: runtime update failed, reloading instead: %s", error)
            else:  # only the server lines change: the config is rewritten to agree
                text = await asyncio.to_thread(render_config, table, self.settings, self._secret)
                await asyncio.to_thread(self._store.replace_config, text)
                self._live = table
                self._record(runtime_updates=self._counters.runtime_updates + 1)
                return
        try:
            await self._write_checked(table)  # while the interval runs out
        except ConfigRejected as error:
            self._record(rejected=self._counters.rejected + 1, last_error=str(error))
            return
        wait = self._last_reload + self.settings.reload_interval - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            await self._reload()
        except ReloadFailed as error:
            self._record(rejected=self._counters.rejected + 1, last_error=str(error))
            return
        self._live = table

    async def _run_changes(self, changes: tuple[planning.ServerChange, ...]) -> None:
        worker = self.master.worker
        assert worker is not None
        for change in changes:
            left_draining = False
            for command in planning.commands(change, change.target in self._draining):
                try:
                    await self.master.cli.expect_worker(worker, command.text, *command.success)
                except RuntimeAPIError:
                    if not command.optional:
                        raise
                    left_draining = True  # its connections keep it; deleted later
            if left_draining:
                self._draining.add(change.target)
            else:
                self._draining.discard(change.target)

    async def _delete_drained(self) -> None:
        """Delete the removed servers whose connections have ended."""
        worker = self.master.worker
        for target in sorted(self._draining):
            if worker is None:
                return
            try:
                await self.master.cli.expect_worker(
                    worker, f"del server {target}", "Server deleted."
                )
            except RuntimeAPIError as error:
                if "No such server" not in str(error):
                    continue
            self._draining.discard(target)

    async def _save_server_states(self) -> None:
        """Keep the worker's server states for the next one (best effort: without them
        the new worker starts every server from its config line)."""
        worker = self.master.worker
        if worker is None:
            return
        try:
            states = await self.master.cli.to_worker(worker, "show servers state")
        except (RuntimeAPIError, OSError, TimeoutError) as error:
            log.warning("router: could not save server states: %s", error)
            return
        text = keep_server_states(states)
        await asyncio.to_thread(write_atomic, self.settings.state_file, text, 0o600)

    async def _reload(self) -> None:
        await self._save_server_states()
        await self._keep_counts()
        started = self._last_reload = time.monotonic()
        await self.master.reload()
        self._draining.clear()
        self._record(
            reloads=self._counters.reloads + 1,
            last_reload_seconds=round(time.monotonic() - started, 4),
        )
