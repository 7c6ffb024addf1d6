"""Writes this router's ``status.ingress`` entry of each route, only when it changes.

``RouteStatusWriter.sync(routes, verdicts)`` takes every route's verdict after a pass
and queues the routes whose stored status (as the watch last delivered it) does not say
that verdict already (``podnet.router.status.route_status`` is None when it does); a
route's status-only change is ``check``ed against its last verdict, so a write of ours
coming back on the watch causes nothing, while a status someone else changed is written
again. There is no write storm: a route is written once per new verdict, plus once per
foreign change of its entry.

Each write puts the new status through ``routes/<name>/status`` onto the route as the
watch last showed it (its resourceVersion the precondition: one call); after a conflict
it reads the route and tries again (``controllers.calls.guaranteed_update``); one work
item per route
(``controllers.workqueue.KeyedQueue``), transient failures retried with backoff. A route
deleted meanwhile is skipped.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from podnet.client.errors import has_reason
from podnet.controllers.calls import ControllerApi, call, guaranteed_update
from podnet.controllers.workqueue import KeyedQueue
from podnet.model.kinds import ROUTE
from podnet.router.admission import RouteKey, Verdict
from podnet.router.status import route_status

log = logging.getLogger("podnet.router.status")

Obj = Mapping[str, Any]
WORKERS = 8


def rfc3339_now() -> str:
    """The time now as a condition's ``lastTransitionTime`` (seconds, UTC)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RouteStatusWriter:
    """Keeps this router's entry in each route's ``status.ingress`` equal to its verdict."""

    def __init__(
        self,
        api: ControllerApi,
        router_name: str,
        now: Callable[[], str] = rfc3339_now,
        workers: int = WORKERS,
    ) -> None:
        self.api, self.router_name, self.now = api, router_name, now
        self.verdicts: dict[RouteKey, Verdict] = {}
        self._checked: dict[RouteKey, Obj] = {}  # the route object each verdict was checked on
        self._seen: dict[RouteKey, Obj] = {}  # the route object a queued write starts from
        self.writes = 0  # status writes made (tests and logs)
        self.queue = KeyedQueue("route-status", self._write, workers=workers)

    def start(self) -> None:
        """Start the writers."""
        self.queue.start()

    async def stop(self) -> None:
        """Stop the writers (a write in flight is abandoned; the next run redoes it)."""
        await self.queue.stop()

    def sync(self, routes: Mapping[RouteKey, Obj], verdicts: Mapping[RouteKey, Verdict]) -> None:
        """Take every route's verdict; queue the routes whose status says otherwise (only
        routes whose object or verdict changed since the last sync are looked at)."""
        previous, self.verdicts = self.verdicts, dict(verdicts)
        checked: dict[RouteKey, Obj] = {}
        for key, verdict in verdicts.items():
            route = routes.get(key)
            if route is None:
                continue
            checked[key] = route
            if self._checked.get(key) is not route or previous.get(key) != verdict:
                self.check(routes, key)
        self._checked = checked

    def check(self, routes: Mapping[RouteKey, Obj], key: RouteKey) -> None:
        """Queue ``key`` when its stored status differs from its last verdict."""
        route, verdict = routes.get(key), self.verdicts.get(key)
        if route is None or verdict is None:
            return
        if route_status(route, self.router_name, verdict, self.now()) is not None:
            self._seen[key] = route
            self.queue.add(f"{key[0]}/{key[1]}")

    async def wait_idle(self) -> None:
        """Until no write is queued or running."""
        await self.queue.wait_idle()

    async def _write(self, item: str) -> None:
        namespace, _, name = item.partition("/")
        key = (namespace, name)
        verdict, seen = self.verdicts.get(key), self._seen.pop(key, None)
        if verdict is None:
            return  # deleted since it was queued

        def mutate(route: Obj) -> dict[str, Any] | None:
            status = route_status(route, self.router_name, verdict, self.now())
            return None if status is None else {**route, "status": status}

        try:
            written = await self._put(seen, mutate) if seen is not None else None
            if written is None:
                written = await guaranteed_update(
                    self.api, ROUTE, namespace, name, mutate, status=True
                )
        except Exception as exc:
            if has_reason(exc, "NotFound"):
                return
            raise
        if written is not None:
            self.writes += 1
            what = "admitted" if verdict.admitted else f"not admitted ({verdict.reason})"
            log.info("route %s/%s: %s", namespace, name, what)

    async def _put(
        self, seen: Obj, mutate: Callable[[Obj], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Write the status onto the route as the watch last showed it (one call); None
        after a conflict (or when it says the verdict already): read and try again."""
        new = mutate(seen)
        if new is None:
            return None
        try:
            return await call(lambda: self.api.update_status(ROUTE, new), "update route status")
        except Exception as exc:
            if has_reason(exc, "Conflict"):
                return None
            raise
