"""A throwaway Open vSwitch node for tests: a namespace of its own, a private
``ovsdb-server``/``ovs-vswitchd`` inside it and ``br0``; all of it removed afterwards.

The namespace gets a per-run unique name and the instance a short base directory under
/tmp (the unix sockets must fit 108 bytes, which pytest's ``tmp_path`` may not), and both
are removed by exact name and PID in the finalizer, also when the test fails.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from podnet import netns
from podnet.dataplane.ovs import tables
from podnet.dataplane.ovs.daemons import OvsDaemons, stop_instance
from podnet.dataplane.ovs.ofctl import OfctlRunner
from podnet.dataplane.ovs.ovsdb import Ovsdb
from podnet.testing import tools
from podnet.testing.lab import unique_run


@dataclass
class OvsNode:
    """One node's namespace, its OVS daemons, a database connection and a flow runner."""

    ns: str
    daemons: OvsDaemons
    db: Ovsdb
    runner: OfctlRunner

    @property
    def base(self) -> Path:
        return self.daemons.paths.base


@contextlib.asynccontextmanager
async def ovs_node(tag: str, bridge: str = tables.BRIDGE) -> AsyncIterator[OvsNode]:
    """A namespace ``<tag>-<run>`` with OVS running inside and ``bridge`` made."""
    tools.require("ovs-vswitchd")
    tools.require("ovs-ofctl")
    ns = unique_run(tag)
    base = Path(tempfile.mkdtemp(prefix="ovs-", dir="/tmp"))
    db: Ovsdb | None = None
    try:
        netns.create(ns)
        with netns.entered(ns):
            daemons = OvsDaemons(base / "ovs")
        try:
            await daemons.start()
            db = await Ovsdb.connect(daemons.paths.db_socket)
            await db.ensure_bridge(bridge, daemons.datapath)
            yield OvsNode(ns, daemons, db, OfctlRunner(daemons.paths))
        finally:
            daemons.close()
    finally:
        if db is not None:
            await db.close()
        stop_instance(base / "ovs", remove=True)
        shutil.rmtree(base, ignore_errors=True)
        netns.remove(ns)
