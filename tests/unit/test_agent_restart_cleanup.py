"""A restarted agent's start-up cleanup and the Pod objects of what it detaches."""

from __future__ import annotations

from pathlib import Path

from test_agent_pods import NODE_IP, NODE_NAME, Api, api, cni, make_manager  # noqa: F401
from test_agent_restart_mirrors import _restart

from podnet.agent.podrefs import PodRefs
from podnet.agent.podstatus import PodStatusWriter
from podnet.model.kinds import POD


async def test_a_pod_detached_at_start_up_without_an_ipam_entry_stops_showing_its_ip(
    tmp_path: Path,
    api: Api,  # noqa: F811
) -> None:
    """The IPAM entry of a wired pod is gone (a damaged store, a hand-cleaned directory):
    the restarted agent detaches the pod, and its Pod must not keep the address, which
    the next pod given it would inherit with the old pod's policy identity."""
    await api.put_hostsubnet(NODE_NAME, "10.128.0.0/24", str(NODE_IP))
    spec = {"containers": [{"name": "c"}], "nodeName": NODE_NAME}
    await api.registry.create(POD, {"metadata": {"name": "web"}, "spec": spec}, "default")
    first = await make_manager(tmp_path)
    first.refs = PodRefs(tmp_path / "pods")
    writer = PodStatusWriter(api.client(), NODE_NAME, NODE_IP)
    first.status_writer = writer
    await first.handle(cni("ADD", cid="cid-w", args="K8S_POD_NAME=web"))
    await writer.flush(10)
    pod = await api.pod("web")
    assert pod is not None and pod["status"]["podIP"] == "10.128.0.2"
    entry = next(p for p in (tmp_path / "ipam").rglob("10.128.0.2"))
    entry.unlink()  # the store forgets the address; the sandbox keeps it

    again = await _restart(tmp_path, first, api)
    assert again.attachments() == []  # detached at start-up: unhealthy
    pod = await api.pod("web")
    assert pod is not None and not (pod.get("status") or {}).get("podIP"), pod.get("status")
