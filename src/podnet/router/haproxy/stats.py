"""Per-route request and error counts from HAProxy's ``show stat`` (CSV).

A backend's requests are its ``req_tot`` (HTTP) or its sessions, ``stot`` (TCP). Its
errors are, for HTTP, its 5xx answers (``hrsp_5xx``: the pods' own, and HAProxy's
502/503/504 for a server it could not reach, ``econ``, or that failed, ``eresp``; those
two would count a request twice, ``econ`` once per retry); for TCP, ``econ`` and
``eresp``. A reload starts a worker with fresh counters, so ``StatsTotals`` adds each
worker's last counts to the next one's: the totals only grow.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

BACKEND_PREFIXES = ("be_http:", "be_edge_http:", "be_secure:", "be_tcp:")


@dataclass(frozen=True)
class BackendStats:
    """One route backend's counters."""

    backend: str  # e.g. be_http:ns:name
    requests: int
    errors: int

    @property
    def route(self) -> str:
        """``<namespace>:<name>`` of the route the backend serves."""
        return self.backend.split(":", 1)[1]


def _count(row: dict[str, str], field: str) -> int:
    value = row.get(field) or ""
    return int(value) if value.isdigit() else 0


def parse_show_stat(text: str) -> dict[str, BackendStats]:
    """The route backends' counters in ``show stat`` output, by backend name."""
    header, _, body = text.lstrip("# ").partition("\n")
    reader = csv.DictReader(io.StringIO(body), fieldnames=header.rstrip(",").split(","))
    result = {}
    for row in reader:
        name = row.get("pxname") or ""
        if row.get("svname") != "BACKEND" or not name.startswith(BACKEND_PREFIXES):
            continue
        if row.get("req_tot"):  # HTTP: every failure is answered with a 5xx, counted once
            requests, errors = _count(row, "req_tot"), _count(row, "hrsp_5xx")
        else:  # TCP: sessions, and those whose server could not be reached or failed
            requests, errors = _count(row, "stot"), _count(row, "econ") + _count(row, "eresp")
        result[name] = BackendStats(name, requests, errors)
    return result


class StatsTotals:
    """Counters that survive reloads: each worker's counts on top of its predecessors'."""

    def __init__(self) -> None:
        self._worker: int | None = None
        self._base: dict[str, tuple[int, int]] = {}
        self._last: dict[str, BackendStats] = {}

    def add(self, worker: int, current: dict[str, BackendStats]) -> dict[str, BackendStats]:
        """Fold in ``worker``'s counters; return the totals by backend."""
        if self._worker is not None and worker != self._worker:
            for name, seen in self._last.items():
                requests, errors = self._base.get(name, (0, 0))
                self._base[name] = (requests + seen.requests, errors + seen.errors)
        # a removed route's backend is gone from the worker: its totals go too
        self._base = {n: c for n, c in self._base.items() if n in current}
        self._worker, self._last = worker, current
        totals = {}
        for name, seen in sorted(current.items()):
            requests, errors = self._base.get(name, (0, 0))
            totals[name] = BackendStats(name, requests + seen.requests, errors + seen.errors)
        return totals
