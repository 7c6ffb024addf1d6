"""A node's private ovsdb-server and ovs-vswitchd, for real, in a project namespace.

Started in the namespace of the constructing thread, adopted by a restarted agent (and
never a recycled PID), outliving a SIGKILLed agent, restarted by the supervisor after a
kill, stopped with nothing left behind. Every namespace and process is removed by exact
name and PID (``podnet.testing.ovsnode``), also when a test fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from podnet import netns
from podnet.dataplane.ovs.daemons import (
    DAEMONS,
    OVSDB_SERVER,
    VSWITCHD,
    OvsDaemons,
    OvsPaths,
    OvsUnavailable,
    datapath_type,
    running_pid,
    stop_instance,
)
from podnet.testing.ovsnode import OvsNode, ovs_node

pytestmark = [pytest.mark.root]


@pytest.fixture
async def node() -> AsyncIterator[OvsNode]:
    async with ovs_node("ovd") as the_node:
        yield the_node


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def pids(paths: OvsPaths) -> dict[str, int | None]:
    return {daemon: running_pid(paths, daemon) for daemon in DAEMONS}


def assert_nothing_left(paths: OvsPaths, old: dict[str, int | None]) -> None:
    for daemon, pid in old.items():
        assert pid is not None and not alive(pid), f"{daemon} (pid {pid}) still runs"
    if paths.run_dir.exists():
        assert sorted(os.listdir(paths.run_dir)) == [], "sockets or pidfiles left"


async def test_daemons_run_in_the_callers_namespace(node: OvsNode) -> None:
    started = pids(node.daemons.paths)
    ns_inode = os.stat(netns.path(node.ns)).st_ino
    for daemon, pid in started.items():
        assert pid is not None, daemon
        assert netns_inode(pid) == ns_inode, f"{daemon} is not in {node.ns}"
        assert netns_inode(pid) != os.stat("/proc/self/ns/net").st_ino
    assert node.daemons.datapath == datapath_type()
    assert os.stat(node.daemons.paths.run_dir).st_mode & 0o777 == 0o700
    assert node.daemons.paths.db_socket.is_socket()
    assert node.daemons.paths.mgmt("br0").is_socket()


async def test_a_restarted_agent_adopts_the_running_daemons(node: OvsNode) -> None:
    before = pids(node.daemons.paths)
    with netns.entered(node.ns):
        again = OvsDaemons(node.base)
    try:
        assert await again.start() == []
    finally:
        again.close()
    assert pids(node.daemons.paths) == before
    assert [p.name for p in await node.db.ports("br0")] == []  # the same database


async def test_a_recycled_pid_is_not_adopted(node: OvsNode) -> None:
    """A pidfile naming a process that is not this instance's vswitchd (another program,
    or another instance's vswitchd) is not adopted: a new daemon is started and the other
    process is left alone."""
    paths = node.daemons.paths
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        await node.daemons.stop()
        paths.run_dir.mkdir(parents=True, exist_ok=True)
        paths.pidfile(VSWITCHD).write_text(f"{stranger.pid}\n")
        paths.pidfile(OVSDB_SERVER).write_text(f"{stranger.pid}\n")
        assert running_pid(paths, VSWITCHD) is None
        assert sorted(await node.daemons.start()) == sorted(DAEMONS)
        fresh = pids(paths)
        assert stranger.pid not in fresh.values() and None not in fresh.values()
        assert stranger.poll() is None, "the stranger was signalled"
    finally:
        stranger.kill()
        stranger.wait()


async def test_another_instances_daemon_is_not_adopted(node: OvsNode) -> None:
    async with ovs_node("ovd2") as other:
        theirs = running_pid(other.daemons.paths, VSWITCHD)
        assert theirs is not None
        await node.daemons.stop()
        node.daemons.paths.run_dir.mkdir(parents=True, exist_ok=True)
        node.daemons.paths.pidfile(VSWITCHD).write_text(f"{theirs}\n")
        assert running_pid(node.daemons.paths, VSWITCHD) is None
        await node.daemons.start()
        assert running_pid(other.daemons.paths, VSWITCHD) == theirs
        assert running_pid(node.daemons.paths, VSWITCHD) not in (None, theirs)


AGENT = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from podnet.dataplane.ovs.daemons import OvsDaemons
    daemons = OvsDaemons(Path(sys.argv[1]))
    asyncio.run(daemons.start())
    print("started", flush=True)
    sys.stdin.read()
    """
)


async def test_daemons_outlive_a_sigkilled_agent(tmp_path: Path) -> None:
    """An 'agent' process inside the namespace starts the daemons and is SIGKILLed; the
    daemons keep running there, and the next agent adopts them."""
    async with ovs_node("ovk") as node:
        await node.daemons.stop(remove=True)
        agent = subprocess.Popen(
            netns.command(node.ns, [sys.executable, "-c", AGENT, str(node.base)]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert agent.stdout is not None
            assert agent.stdout.readline().strip() == "started"
        finally:
            agent.send_signal(signal.SIGKILL)
            agent.wait()
        survivors = pids(node.daemons.paths)
        assert None not in survivors.values()
        assert all(alive(pid) for pid in survivors.values() if pid)
        assert await node.daemons.start() == []
        assert pids(node.daemons.paths) == survivors


async def test_supervisor_restarts_a_killed_daemon_and_tells(node: OvsNode) -> None:
    restarted: asyncio.Queue[str] = asyncio.Queue()

    async def tell(name: str) -> None:
        await restarted.put(name)

    supervisor = asyncio.create_task(node.daemons.supervise(tell))
    try:
        await node.db.add_port("br0", "tun0", type="internal", ofport=2)
        for daemon in (VSWITCHD, OVSDB_SERVER):
            old = running_pid(node.daemons.paths, daemon)
            assert old is not None
            os.kill(old, signal.SIGKILL)
            assert await asyncio.wait_for(restarted.get(), 10) == daemon
            new = running_pid(node.daemons.paths, daemon)
            assert new is not None and new != old and alive(new)
        # the restarted vswitchd re-made br0 and tun0 (same ofport) from the database
        port = await node.db.port("tun0")
        assert port is not None and port.ofport == 2
        assert (
            "tun0"
            in subprocess.run(
                netns.command(node.ns, ["ip", "-o", "link", "show", "tun0"]),
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
    finally:
        supervisor.cancel()
        with pytest.raises(asyncio.CancelledError):
            await supervisor


async def test_both_killed_come_back_database_first_despite_a_failing_callback(
    node: OvsNode,
) -> None:
    told: list[str] = []
    all_told = asyncio.Event()

    async def tell(name: str) -> None:
        told.append(name)
        if len(told) == len(DAEMONS):
            all_told.set()
        if name == OVSDB_SERVER:
            raise RuntimeError("the caller's own failure")

    supervisor = asyncio.create_task(node.daemons.supervise(tell))
    try:
        old = pids(node.daemons.paths)
        for pid in old.values():
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(all_told.wait(), 20)
        assert told == [OVSDB_SERVER, VSWITCHD]
        new = pids(node.daemons.paths)
        assert all(new[d] not in (None, old[d]) for d in DAEMONS)
        assert not supervisor.done(), "supervision goes on after the callback failed"
        await node.db.add_port("br0", "tun0", type="internal", ofport=2)  # db reachable
    finally:
        supervisor.cancel()
        with pytest.raises(asyncio.CancelledError):
            await supervisor


async def test_stop_leaves_no_process_socket_or_pidfile(node: OvsNode) -> None:
    supervisor = asyncio.create_task(node.daemons.supervise(_nothing))
    before = pids(node.daemons.paths)
    assert sorted(await node.daemons.stop()) == sorted(DAEMONS)
    await asyncio.wait_for(supervisor, 10)  # it ends instead of restarting them
    assert_nothing_left(node.daemons.paths, before)
    assert node.daemons.paths.db.exists(), "the database stays without remove"
    assert await node.daemons.stop() == []  # idempotent


async def test_stop_after_sigkill_removes_the_leftovers(node: OvsNode) -> None:
    before = pids(node.daemons.paths)
    for pid in before.values():
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    for pid in before.values():
        assert pid is not None
        while alive(pid):
            await asyncio.sleep(0.01)
    assert node.daemons.paths.db_socket.exists(), "SIGKILL leaves the socket"
    assert stop_instance(node.base, remove=True) == []
    assert_nothing_left(node.daemons.paths, before)
    assert not node.base.exists()


async def test_socket_path_too_long_is_refused(tmp_path: Path) -> None:
    base = tmp_path / ("x" * 100)
    with pytest.raises(OvsUnavailable, match="longer than 107 bytes"):
        OvsDaemons(base)
    assert not base.exists()


async def test_the_sockets_refuse_other_users(node: OvsNode) -> None:
    """Threat model: only root may program the node's switch or read its database."""
    for sock in (node.daemons.paths.db_socket, node.daemons.paths.mgmt("br0")):
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
             sys.executable, "-c", CONNECT, str(sock)],
            capture_output=True,
            text=True,
        )  # fmt: skip
        assert done.returncode != 0 and "PermissionError" in done.stderr, done.stderr
    root = subprocess.run([sys.executable, "-c", CONNECT, str(node.daemons.paths.db_socket)])
    assert root.returncode == 0, "root is let in"


CONNECT = "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])"


async def _nothing(name: str) -> None:
    return None
