"""Crash a node's own Open vSwitch daemons, for the chaos test on the ovs data plane.

Besides the agent, an ovs node runs ``ovsdb-server`` and ``ovs-vswitchd`` (under the agent's
state directory, see ``podnet.cluster.ovsnodes``). The agent supervises them by pidfd:
it starts a daemon that died again and, after ``ovs-vswitchd``, programs the new switch
(tun0, the host's side, every flow; the version note last). So these victims are not
restarted by the test: ``kill`` sends SIGKILL through a pidfd (to that very process, found
by its pidfile and checked to be this instance's daemon), and ``wait_back`` waits for the
agent's work to show: the daemon runs again with a new PID; the database answers
(``ovsdb-server``); br0 holds a version note again, which the agent writes only once the
rest of the table is in (``ovs-vswitchd``: a new one starts with no flow).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from podnet.cluster.ovsnodes import node_ovs_base, running
from podnet.cluster.state import wait_exited
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.instance import DAEMONS, OVSDB_SERVER, OvsPaths, running_pid
from podnet.testing.e2e import wait_for
from podnet.testing.planeview import br0_flows, vsctl

KINDS = DAEMONS  # ("ovsdb-server", "ovs-vswitchd"): a victim's kind is the daemon's name
NOT_YET = (RuntimeError, OSError, subprocess.SubprocessError)  # a tool failed: not back yet


def kill(state_dir: Path, node: str, daemon: str) -> int:
    """SIGKILL ``node``'s ``daemon`` and wait until it has exited; its PID (0: it was
    not running)."""
    paths = OvsPaths(node_ovs_base(state_dir, node))
    pid = running_pid(paths, daemon)
    if pid is None:
        return 0
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return 0
    try:
        if running_pid(paths, daemon) != pid:  # it went (and maybe came back) meanwhile
            return 0
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)
    wait_exited(pid)
    return pid


def wait_back(state_dir: Path, node: str, daemon: str, timeout: float) -> None:
    """Until the agent of ``node`` has brought ``daemon`` back (see the module), after
    ``kill``: whatever runs under the daemon's pidfile now is a new process."""
    base = node_ovs_base(state_dir, node)
    wait_for(lambda: _both_run(base), timeout, f"{node}'s {daemon} to run again", 0.05)
    if daemon == OVSDB_SERVER:
        what = f"{node}'s {daemon} to answer"
        wait_for(lambda: _db_answers(state_dir, node), timeout, what, 0.05, NOT_YET)
        return
    what = f"{node}'s {t.BRIDGE} to hold its flows and version note again"
    wait_for(lambda: _noted(state_dir, node), timeout, what, 0.05, NOT_YET)


def _both_run(base: Path) -> bool:
    return len(running(base)) == len(DAEMONS)


def _db_answers(state_dir: Path, node: str) -> bool:
    return vsctl(state_dir, node, "br-exists", t.BRIDGE) == ""  # else: an error


def _noted(state_dir: Path, node: str) -> bool:
    return "actions=" in br0_flows(state_dir, node, f"table={t.NOTE}")
