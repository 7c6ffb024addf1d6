"""The CNI server on a unix socket: permissions, stale sockets, answers, per-container
ordering, the Python shim talking to it, and the plugin/conflist installation."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podnet.agent import cniplugin, cniserver
from podnet.agent.cnierrors import ERR_DATAPLANE
from podnet.agent.cniplugin import conflist, install_plugin_once
from podnet.agent.cniserver import CniServer, CniServerError, claim_socket_path
from podnet.agent.config import AgentConfig
from podnet.agent.containerlocks import ContainerLocks
from podnet.agent.pods import PodManager
from podnet.cni import shim
from podnet.dataplane.fake import FakeDataPlane
from podnet.dataplane.interface import NodeNetwork, PodAttachment, PodNetwork
from podnet.files import write_if_changed
from podnet.ipam.hostlocal import HostLocalStore
from podnet.testing.e2e import eventually

NODE = NodeNetwork(
    "node-a",
    IPv4Address("192.0.2.10"),
    IPv4Network("10.128.0.0/24"),
    (IPv4Network("10.128.0.0/14"),),
    IPv4Network("172.30.0.0/16"),
    1450,
)


class GatedDataPlane(FakeDataPlane):
    """Attaches wait at a gate (open unless a test closes it); which containers are inside
    ``attach_pod`` at once and the order of attach and detach are recorded, so overlap
    and per-container order are seen, not timed."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.attaching: list[str] = []
        self.order: list[str] = []  # "attached c1", "detach c3", ...

    async def attach_pod(self, pod: PodNetwork) -> PodAttachment:
        self.attaching.append(pod.container_id)
        try:
            await self.gate.wait()
            return await super().attach_pod(pod)
        finally:
            self.attaching.remove(pod.container_id)
            self.order.append(f"attached {pod.container_id}")

    async def detach_pod(self, container_id: str, ifname: str, netns: str | None) -> None:
        self.order.append(f"detach {container_id}")
        await super().detach_pod(container_id, ifname, netns)


class LockRequests(ContainerLocks):
    """Per-container locks that remember who asked for one (before getting it)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    @asynccontextmanager
    async def hold(self, container_id: str) -> AsyncIterator[None]:
        self.asked.append(container_id)
        async with super().hold(container_id):
            yield


class BuggyDataPlane(FakeDataPlane):
    async def attach_pod(self, pod: PodNetwork) -> PodAttachment:
        raise KeyError("a bug")


def body(command: str, cid: str = "c1", version: str = "1.0.0", **env: str) -> bytes:
    full = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/ns/x"}
    config = json.dumps({"cniVersion": version, "name": "podnet", "type": "podnet"})
    return json.dumps({"env": {**full, "CNI_IFNAME": "eth0", **env}, "config": config}).encode()


async def start_server(tmp_path: Path, dataplane: FakeDataPlane) -> CniServer:
    await dataplane.setup_node(NODE)
    pods = PodManager(dataplane, HostLocalStore(tmp_path / "ipam", "podnet"), NODE)
    server = CniServer(tmp_path / "run" / "cni.sock", pods)
    await server.start()
    return server


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[CniServer]:
    running = await start_server(tmp_path, GatedDataPlane())
    yield running
    await running.stop()


async def post(server: CniServer, payload: bytes) -> tuple[int, Any]:
    connector = aiohttp.UnixConnector(path=str(server.socket_path))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post("http://agent/cni", data=payload) as resp,
    ):
        text = await resp.text()
        return resp.status, json.loads(text) if text else None


async def test_socket_and_directory_are_root_only(server: CniServer) -> None:
    assert stat.S_IMODE(server.socket_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(server.socket_path.parent.stat().st_mode) == 0o700
    await server.stop()
    assert not server.socket_path.exists()


async def test_a_shared_directory_is_not_tightened(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    cniserver.prepare_socket_dir(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_a_stale_socket_is_removed_and_a_live_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "cni.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # bound, never listening: like the socket of a killed agent
    claim_socket_path(path)
    assert not path.exists()
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(path))
    live.listen(1)
    try:
        with pytest.raises(CniServerError, match="another podnet agent is serving"):
            claim_socket_path(path)
    finally:
        live.close()
    path.unlink()
    path.write_text("not a socket")
    with pytest.raises(CniServerError, match="is not a socket"):
        claim_socket_path(path)


async def test_answers_results_and_errors(server: CniServer) -> None:
    status, answer = await post(server, body("ADD", version="0.4.0"))
    assert status == 200
    assert answer["cniVersion"] == "0.4.0"
    assert answer["ips"] == [
        {"version": "4", "address": "10.128.0.2/24", "gateway": "10.128.0.1", "interface": 1}
    ]
    status, answer = await post(server, b"{not json")
    assert status == 400 and answer["code"] == 6
    status, answer = await post(server, body("ADD"))  # the interface exists already
    assert status == 500 and answer["code"] == ERR_DATAPLANE
    assert await post(server, body("DEL")) == (200, None)
    assert server.timings["ADD"] and server.timings["DEL"]


async def test_a_bug_is_code_101_and_releases_the_address(tmp_path: Path) -> None:
    running = await start_server(tmp_path, BuggyDataPlane())
    try:
        status, answer = await post(running, body("ADD"))
        assert status == 500 and answer["code"] == 101
        assert "KeyError" in answer["details"]
        assert running.pods.store.allocations() == []
    finally:
        await running.stop()


async def test_serial_per_container_concurrent_across(tmp_path: Path) -> None:
    dataplane = GatedDataPlane()
    server = await start_server(tmp_path, dataplane)
    assert isinstance(server.pods, PodManager)
    locks = server.pods.locks = LockRequests()
    try:
        dataplane.gate.clear()
        adds = asyncio.gather(post(server, body("ADD", "c1")), post(server, body("ADD", "c2")))
        await eventually(lambda: sorted(dataplane.attaching) == ["c1", "c2"], what="overlap")
        dataplane.gate.set()  # both were inside attach_pod at once: concurrent across
        assert [status for status, _ in await adds] == [200, 200]

        dataplane.gate.clear()
        add = asyncio.create_task(post(server, body("ADD", "c3")))
        await eventually(lambda: dataplane.attaching == ["c3"], what="c3's attach")
        delete = asyncio.create_task(post(server, body("DEL", "c3")))
        await eventually(lambda: locks.asked.count("c3") == 2, what="the DEL asking for c3")
        for _ in range(20):  # the DEL waits behind the held ADD, however long it is held
            await asyncio.sleep(0)
        assert not delete.done() and "detach c3" not in dataplane.order
        dataplane.gate.set()
        assert (await add)[0] == 200
        assert await delete == (200, None)
        assert dataplane.order.index("attached c3") < dataplane.order.index("detach c3")
        assert ("c3", "eth0") not in dataplane.state.pods
        # c1 and c2 were added concurrently: either may hold the lower address
        assert sorted(cid for _, cid, _ in server.pods.store.allocations()) == ["c1", "c2"]
    finally:
        dataplane.gate.set()
        await server.stop()


async def test_the_python_shim_talks_to_the_server(server: CniServer) -> None:
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "shim-1", "CNI_NETNS": "/ns/s"}
    env |= {"CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b"}
    config = {"cniVersion": "1.1.0", "name": "podnet", "type": "podnet"}
    config["socketPath"] = str(server.socket_path)
    code, out = await asyncio.to_thread(shim.run, env, json.dumps(config).encode())
    assert code == 0
    result = json.loads(out)
    assert result["interfaces"][1] == {
        "name": "eth0",
        "mac": "0a:58:0a:80:00:02",
        "mtu": 1450,
        "sandbox": "/ns/s",
    }
    status_env = {"CNI_COMMAND": "STATUS"}
    server.pods.ready = True
    assert await asyncio.to_thread(shim.run, status_env, json.dumps(config).encode()) == (0, b"")


# ---- what runtimes read ----------------------------------------------------------------------


def test_conflist_written_only_when_changed(tmp_path: Path) -> None:
    config = AgentConfig("node-a", cni_conf_dir=tmp_path, socket_path=Path("/run/p/cni.sock"))
    text = conflist(config, 1400)
    assert json.loads(text) == {
        "cniVersion": "1.0.0",
        "name": "podnet",
        "plugins": [
            {"type": "podnet", "socketPath": "/run/p/cni.sock", "mtu": 1400},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }
    assert write_if_changed(config.conflist_path, text)
    mtime = config.conflist_path.stat().st_mtime_ns
    assert not write_if_changed(config.conflist_path, text)
    assert config.conflist_path.stat().st_mtime_ns == mtime
    assert stat.S_IMODE(config.conflist_path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["10-podnet.conflist"]


def test_plugin_is_rebuilt_only_when_its_sources_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[Path] = []

    def install(bin_dir: Path, python: str) -> Path:
        builds.append(bin_dir)
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "podnet").write_bytes(os.urandom(8))
        return bin_dir / "podnet"

    monkeypatch.setattr(cniplugin, "install_shim", install)
    stamp = tmp_path / "stamp"
    python = os.path.realpath(shim.sys.executable)
    assert install_plugin_once(tmp_path / "bin", python, stamp)[1]
    assert not install_plugin_once(tmp_path / "bin", python, stamp)[1]
    (tmp_path / "bin" / "podnet").write_bytes(b"replaced by hand")
    assert install_plugin_once(tmp_path / "bin", python, stamp)[1]
    assert len(builds) == 2
