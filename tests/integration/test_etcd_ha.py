"""etcd with TLS and client certificates, a restarted etcd, a 3-member etcd, two masters.

Real etcd members and real ``podnet master`` processes, started by the same
``ControlPlane`` that ``podnet cluster up`` uses (no nodes: control plane only).
"""

from __future__ import annotations

import asyncio
import http.client
import ssl
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from podnet.cluster.controlplane import ControlPlane
from podnet.cluster.health import LEADER_KEY, control_plane_health
from podnet.store.base import StoreError
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_pki import EtcdTls, ensure_etcd_pki
from podnet.store.etcd_process import EtcdProcess, free_port
from podnet.testing.api import client_for, namespace, node
from podnet.testing.e2e import wait_for as _wait_for

NAMESPACES = "/api/v1/namespaces"
NODES = "/api/v1/nodes"
HOSTSUBNETS = "/apis/network.openshift.io/v1/hostsubnets"
NETNAMESPACES = "/apis/network.openshift.io/v1/netnamespaces"


def quiet(line: str) -> None:
    """Progress output of the control plane, kept out of the way."""


@pytest.fixture
def control_plane(tmp_path: Path) -> Iterator[Callable[..., ControlPlane]]:
    """``make(members, masters, plugin)`` starts a control plane; all are stopped after."""
    planes: list[ControlPlane] = []

    def make(members: int = 1, masters: int = 1, plugin: str = "multitenant") -> ControlPlane:
        plane = ControlPlane(tmp_path / f"cp{len(planes)}")
        planes.append(plane)
        plane.up(plugin, [], quiet, members, masters)
        return plane

    try:
        yield make
    finally:
        for plane in planes:
            plane.down(quiet)


async def _store_revision(endpoint: str, tls: EtcdTls | None) -> int:
    store = EtcdStore(endpoint, timeout=3.0, tls=tls)
    try:
        await store.connect()
        return await store.revision()
    finally:
        await store.close()


# ---- finding 3: etcd has TLS and client-certificate auth --------------------------------


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """One TLS member with client-certificate auth on client and peer ports."""
    root = tmp_path_factory.mktemp("tls-etcd")
    pki = ensure_etcd_pki(root / "pki", {"etcd1": []})
    etcd = EtcdProcess(root / "etcd1", free_port(), free_port(), name="etcd1", pki=pki)
    etcd.start()
    try:
        yield etcd
    finally:
        etcd.stop(remove_data=True)


def test_etcd_refuses_a_client_without_a_certificate(tls_etcd: EtcdProcess) -> None:
    """Finding 3: a local user without the master's certificate cannot reach the registry."""
    assert tls_etcd.pki is not None
    port = tls_etcd.client_port
    plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    with pytest.raises((OSError, http.client.HTTPException)):
        plain.request("GET", "/v3/kv/range")  # plain HTTP to the TLS port
        plain.getresponse()
    anonymous = ssl.create_default_context(cafile=str(tls_etcd.pki.ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=anonymous)
    with pytest.raises((ssl.SSLError, OSError)):
        conn.request("POST", "/v3/kv/range", body=b'{"key": "Lw=="}')
        conn.getresponse()
    with pytest.raises(StoreError):  # gRPC over TLS, no client certificate
        asyncio.run(_store_revision(tls_etcd.endpoint, EtcdTls(tls_etcd.pki.ca, Path(), Path())))


def test_etcd_refuses_plain_grpc_and_a_peer_certificate(tls_etcd: EtcdProcess) -> None:
    """Neither a plaintext gRPC client nor a member's peer certificate (another CA) is a
    client; the master's client certificate is."""
    assert tls_etcd.pki is not None
    pki = tls_etcd.pki
    with pytest.raises(StoreError):
        asyncio.run(_store_revision(tls_etcd.endpoint, None))
    peer = pki.peer("etcd1")
    with pytest.raises(StoreError):
        asyncio.run(_store_revision(tls_etcd.endpoint, EtcdTls(pki.ca, peer.cert, peer.key)))
    assert asyncio.run(_store_revision(tls_etcd.endpoint, pki.client_tls())) > 0


def test_peer_port_refuses_a_client_certificate(tls_etcd: EtcdProcess) -> None:
    """The peer port trusts only the peer CA: the masters' client certificate cannot
    talk raft or join the cluster, and neither can a client without a certificate."""
    assert tls_etcd.pki is not None
    pki = tls_etcd.pki
    client = pki.client_tls()
    for cert in (client, None):
        context = ssl.create_default_context(cafile=str(pki.peer_ca))
        context.check_hostname = False
        if cert is not None:
            context.load_cert_chain(str(cert.cert), str(cert.key))
        conn = http.client.HTTPSConnection("127.0.0.1", tls_etcd.peer_port, timeout=5,
                                           context=context)  # fmt: skip
        with pytest.raises((ssl.SSLError, OSError)):
            conn.request("GET", "/members")
            conn.getresponse()
    peer = pki.peer("etcd1")  # the control: a member's own peer certificate gets in
    context = ssl.create_default_context(cafile=str(pki.peer_ca))
    context.check_hostname = False
    context.load_cert_chain(str(peer.cert), str(peer.key))
    conn = http.client.HTTPSConnection("127.0.0.1", tls_etcd.peer_port, timeout=5,
                                       context=context)  # fmt: skip
    conn.request("GET", "/members")
    assert conn.getresponse().status == 200


def test_etcd_pki_files_are_private(tls_etcd: EtcdProcess) -> None:
    assert tls_etcd.pki is not None
    directory = tls_etcd.pki.directory
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    keys = sorted(directory.glob("*.key"))
    assert len(keys) == 5  # two CAs, member, peer, master client
    assert all(stat.S_IMODE(k.stat().st_mode) == 0o600 for k in keys)
    assert stat.S_IMODE(tls_etcd.data_dir.stat().st_mode) == 0o700


def test_master_flags_reject_partial_tls(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from podnet.cli.master_cmd import master

    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    args = ["--etcd", "127.0.0.1:1", "--etcd-cafile", str(ca), "--state-dir", str(tmp_path)]
    result = CliRunner().invoke(master, args)
    assert result.exit_code != 0
    assert "--etcd-certfile" in result.output
    bad = CliRunner().invoke(master, ["--etcd", "127.0.0.1:x", "--state-dir", str(tmp_path)])
    assert bad.exit_code != 0 and "bad etcd endpoint" in bad.output


def test_cluster_etcd_has_no_plain_port(control_plane: Callable[..., ControlPlane]) -> None:
    """The control plane of `cluster up` runs etcd with client-certificate auth."""
    plane = control_plane()
    state = plane.state()
    assert state is not None
    endpoint = plane.etcd_endpoints(state)
    with pytest.raises(StoreError):
        asyncio.run(_store_revision(endpoint, None))
    assert asyncio.run(_store_revision(endpoint, plane.etcd_tls())) > 0


# ---- finding 4: a restarted etcd keeps its port and data; the master reconnects ----------


def test_killed_etcd_comes_back_on_its_port_and_the_master_reconnects(
    control_plane: Callable[..., ControlPlane],
) -> None:
    plane = control_plane()
    before = plane.state()
    assert before is not None and before.masters[0].process is not None
    master_pid = before.masters[0].process.pid
    with client_for(plane.kubeconfig, timeout=30) as api:
        assert api.post(NAMESPACES, json=namespace("kept")).status_code == 201
        assert plane.kill_member(0) > 0
        # Meanwhile the API answers with an error, it does not hang.
        assert api.get(f"{NAMESPACES}/kept").status_code in (200, 503, 504)
        assert api.post(NAMESPACES, json=namespace("during")).status_code in (503, 504)
        plane.up("multitenant", [], quiet)  # what `podnet cluster up` does again
        after = plane.state()
        assert after is not None
        assert after.etcd_members[0].client_port == before.etcd_members[0].client_port
        assert after.masters[0].process is not None
        assert after.masters[0].process.pid == master_pid  # never restarted by hand
        wait_for(
            lambda: api.post(NAMESPACES, json=namespace("after")).status_code == 201,
            60,
            "the master to write through the restarted etcd",
        )
        assert api.get(f"{NAMESPACES}/kept").status_code == 200  # the data survived
    assert before.masters[0].process.alive()


# ---- 3-member etcd ----------------------------------------------------------------------


def _create_namespaces(api: httpx.Client, names: list[str]) -> list[int]:
    answers = [api.post(NAMESPACES, json=namespace(n)) for n in names]
    failed = [a.text for a in answers if a.status_code != 201]
    print(*failed[:3], sep="\n")  # shown when the test fails
    return [a.status_code for a in answers]


def test_three_members_lose_one_without_effect_and_recover_quorum(
    control_plane: Callable[..., ControlPlane],
) -> None:
    plane = control_plane(members=3)
    with client_for(plane.kubeconfig, timeout=40) as api:
        assert _create_namespaces(api, ["q-a"]) == [201]
        plane.kill_member(0)  # the member the master's channel uses first
        codes = _create_namespaces(api, [f"q-one-down-{i}" for i in range(20)])
        assert codes == [201] * 20, codes
        plane.kill_member(1)  # quorum lost: writes fail with an error, never hang
        assert api.post(NAMESPACES, json=namespace("q-none")).status_code in (503, 504)
        plane.restart_member(0, quiet)
        plane.restart_member(1, quiet)
        wait_for(
            lambda: api.post(NAMESPACES, json=namespace("q-back")).status_code == 201,
            60,
            "writes after quorum returned",
        )
    state = plane.state()
    assert state is not None
    wait_for(lambda: control_plane_health(state, plane).ok, 30, "a healthy control plane")


# ---- two masters ------------------------------------------------------------------------


def _leader_index(plane: ControlPlane) -> int:
    state = plane.state()
    assert state is not None
    report = control_plane_health(state, plane)
    leaders = [i for i, m in enumerate(report.masters) if m.leader and m.alive]
    assert len(leaders) == 1, report
    return leaders[0]


def _hostsubnet(api: httpx.Client, name: str) -> dict[str, Any] | None:
    response = api.get(f"{HOSTSUBNETS}/{name}")
    return response.json() if response.status_code == 200 else None


def _netid(api: httpx.Client, name: str) -> int | None:
    response = api.get(f"{NETNAMESPACES}/{name}")
    return int(response.json()["netid"]) if response.status_code == 200 else None


def test_two_masters_the_standby_takes_over_allocation(
    control_plane: Callable[..., ControlPlane],
) -> None:
    plane = control_plane(members=3, masters=2)
    state = plane.state()
    assert state is not None
    tag = uuid.uuid4().hex[:6]
    with client_for(plane.kubeconfig, timeout=30) as api:  # through the admin relay
        for master in state.masters:  # both serve the API
            direct = httpx.get(f"https://127.0.0.1:{master.port}/healthz", verify=False)
            assert direct.status_code == 200
        for i in range(3):
            api.post(NODES, json=node(f"n{i}-{tag}", f"192.0.2.{10 + i}")).raise_for_status()
            api.post(NAMESPACES, json=namespace(f"p{i}-{tag}")).raise_for_status()
        for i in range(3):
            wait_for(partial(_hostsubnet, api, f"n{i}-{tag}"), 30, "first subnets")
            wait_for(partial(_netid, api, f"p{i}-{tag}"), 30, "first VNIDs")
        leader = _leader_index(plane)
        assert plane.kill_master(leader) > 0
        killed = time.monotonic()
        # kubectl's one server (the relay) keeps working, and the standby allocates.
        wait_for(
            lambda: api.post(NODES, json=node(f"late-{tag}", "192.0.2.50")).status_code == 201,
            15,
            "the API through the surviving master",
        )
        api.post(NAMESPACES, json=namespace(f"late-{tag}")).raise_for_status()
        wait_for(lambda: _hostsubnet(api, f"late-{tag}"), 15, "a subnet from the new leader")
        wait_for(lambda: _netid(api, f"late-{tag}"), 15, "a VNID from the new leader")
        took = time.monotonic() - killed
        print(f"standby allocated {took:.1f}s after the leader's SIGKILL")
        assert _leader_index(plane) != leader
        subnets = [h["subnet"] for h in api.get(HOSTSUBNETS).json()["items"]]
        netids = [n["netid"] for n in api.get(NETNAMESPACES).json()["items"] if n["netid"]]
    assert len(subnets) == 4 and len(set(subnets)) == 4, subnets
    assert len(netids) == len(set(netids)), netids
    assert LEADER_KEY.endswith("leader")


# ---- cluster status reports what is really up --------------------------------------------


def test_cluster_status_reports_each_member_and_master(
    control_plane: Callable[..., ControlPlane],
) -> None:
    from click.testing import CliRunner

    from podnet.cli.cluster_cmd import cluster

    plane = control_plane(members=3, masters=2)
    args = ["status", "--state-dir", str(plane.state_dir)]
    healthy = CliRunner().invoke(cluster, args)
    assert healthy.exit_code == 0, healthy.output
    assert healthy.output.count("health ok") == 3 and "control plane: healthy" in healthy.output
    assert healthy.output.count(", leader") == 1
    plane.kill_member(2)
    plane.kill_master(1)
    degraded = CliRunner().invoke(cluster, args)
    assert degraded.exit_code == 1, degraded.output
    lines = degraded.output.splitlines()
    assert any(line.strip().startswith("etcd3") and "DEAD" in line for line in lines)
    assert any(line.strip().startswith("master2") and "DEAD" in line for line in lines)
    assert "control plane: DEGRADED" in degraded.output


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``check`` until truthy; an HTTP error (a master coming back) is "not yet"."""
    return _wait_for(check, timeout, what, ignore=(httpx.HTTPError,))
