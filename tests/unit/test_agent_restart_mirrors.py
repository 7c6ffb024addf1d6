"""A restarted agent and the mirror Pods a killed one left unmade (found by the node
crash e2e test: the sandboxes of ADDs answered just before a SIGKILL were torn down as
orphans after the restart, their mirror Pods never made)."""

from __future__ import annotations

from ipaddress import IPv4Address
from pathlib import Path

from test_agent_pods import NODE_IP, NODE_NAME, Api, api, cni, fake, make_manager  # noqa: F401

from podnet.agent.podrefs import PodRefs
from podnet.agent.pods import PodManager
from podnet.agent.podstatus import MIRROR_ANNOTATION, PodRef, PodStatusWriter
from podnet.api.params import DeleteOptions
from podnet.ipam.hostlocal import HostLocalStore
from podnet.model.kinds import POD

MIRROR, KEPT = ("cid-m", "eth0"), ("cid-k", "eth0")


class KilledWriter(PodStatusWriter):
    """Reads the Pod in ADD as the real writer does, and dies before any write."""

    def running(self, ref: PodRef, ip: IPv4Address, container_id: str, create: bool = True) -> None:
        pass


async def _restart(tmp_path: Path, first: PodManager, api: Api) -> PodManager:  # noqa: F811
    writer = PodStatusWriter(api.client(), NODE_NAME, NODE_IP)
    store = HostLocalStore(tmp_path / "ipam", "podnet")
    again = PodManager(fake(first), store, first.node, writer, refs=PodRefs(tmp_path / "pods"))
    await again.reconcile()
    await writer.flush(10)
    return again


async def test_a_restarted_agent_makes_a_mirror_pod_once_and_never_a_deleted_pod(
    tmp_path: Path,
    api: Api,  # noqa: F811
) -> None:
    await api.put_hostsubnet(NODE_NAME, "10.128.0.0/24", str(NODE_IP))
    spec = {"containers": [{"name": "c"}], "nodeName": NODE_NAME}
    await api.registry.create(POD, {"metadata": {"name": "kept"}, "spec": spec}, "default")
    first = await make_manager(tmp_path)
    first.refs = PodRefs(tmp_path / "pods")
    first.status_writer = KilledWriter(api.client(), NODE_NAME, NODE_IP)
    await first.handle(cni("ADD", cid=MIRROR[0], args="K8S_POD_NAME=mirror"))  # no Pod
    await first.handle(cni("ADD", cid=KEPT[0], args="K8S_POD_NAME=kept"))  # its Pod found
    grace0 = DeleteOptions(None, None, 0)
    await api.registry.delete(POD, "default", "kept", options=grace0)  # while it was down

    again = await _restart(tmp_path, first, api)
    made = await api.pod("mirror")
    assert made is not None, "the mirror Pod the killed agent owed was not made"
    assert made["metadata"]["annotations"][MIRROR_ANNOTATION] == MIRROR[0]
    assert made["status"]["podIP"] == "10.128.0.2"
    assert await api.pod("kept") is None  # a Pod deleted meanwhile stays deleted
    added = {pair: at for pair, _, at in again.attachments()}
    assert added[MIRROR] is not None and added[KEPT] is None  # the mirror settles
    records = PodRefs(tmp_path / "pods").load_records()
    assert not records[MIRROR].mirror and not records[KEPT].mirror  # made: never again

    await api.registry.delete(POD, "default", "mirror", options=grace0)
    await _restart(tmp_path, again, api)
    assert await api.pod("mirror") is None  # deleted after it was made: stays deleted


def test_a_record_says_whether_its_mirror_is_to_be_made(tmp_path: Path) -> None:
    refs = PodRefs(tmp_path / "pods")
    refs.record(MIRROR, ("ns", "m"), mirror=True)
    refs.record(KEPT, ("ns", "k"))
    records = refs.load_records()
    assert records[MIRROR].mirror and not records[KEPT].mirror
    assert refs.load() == {MIRROR: ("ns", "m"), KEPT: ("ns", "k")}
    refs.record(MIRROR, ("ns", "m"))
    assert not refs.load_records()[MIRROR].mirror
