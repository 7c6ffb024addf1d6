"""The HAProxy layer of the router: a ``RouterTable`` rendered to HAProxy's files and
served by a master-worker HAProxy with coalesced, hitless reloads and runtime updates.

Public interface (what the router process uses):

- ``HAProxySettings``: addresses, ports, run directory, default certificate, limits.
- ``HAProxyRouter(settings)``: ``await start(table)``, ``update(table)`` (coalesced),
  ``await settled()``, ``await check(table)`` (``haproxy -c`` only, never served),
  ``counters`` (reloads, last reload time, runtime updates, rejected generations, last
  error, restarts), ``await backend_stats()`` (requests/errors per route backend),
  ``await stop()``.
- ``render(table, settings, secret)``: the files of one generation (pure).
- ``plan_update(live, desired)``: reload, runtime commands, or nothing (pure).
"""

from podnet.router.haproxy.driver import DriverCounters, HAProxyRouter
from podnet.router.haproxy.generations import ConfigRejected
from podnet.router.haproxy.plan import Plan, plan_update
from podnet.router.haproxy.render import Generation, render
from podnet.router.haproxy.settings import HAProxySettings, SettingsError
from podnet.router.haproxy.stats import BackendStats

__all__ = [
    "BackendStats",
    "ConfigRejected",
    "DriverCounters",
    "Generation",
    "HAProxyRouter",
    "HAProxySettings",
    "Plan",
    "SettingsError",
    "plan_update",
    "render",
]
