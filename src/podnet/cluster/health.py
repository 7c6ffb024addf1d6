"""What ``podnet cluster status`` reports about the control plane: what is really up.

Each etcd member: its recorded process alive, and ``/health`` over TLS with the masters'
client certificate (true only while the cluster has quorum). Each master: its process,
``/healthz`` (serving) and ``/readyz`` (serving with etcd; standbys too). The leader:
the holder of the election key in etcd, matched to a master by PID. Each node: what its
agent's reconcile note (``podnet.io/reconcile``) says is wrong, e.g. a policy left out.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from podnet.agent.nodestatus import reconcile_problems
from podnet.cluster.controlplane import REGISTRY_PREFIX, ControlPlane, alive
from podnet.cluster.state import ClusterState
from podnet.controllers.leader import holder_identity
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import health

LEADER_KEY = f"{REGISTRY_PREFIX}leader"


@dataclass(frozen=True)
class MemberHealth:
    name: str
    pid: int
    client_port: int
    alive: bool
    healthy: bool


@dataclass(frozen=True)
class MasterHealth:
    index: int
    pid: int
    port: int
    alive: bool
    serving: bool  # /healthz 200
    ready: bool  # /readyz 200 (serving with etcd, the cluster set up; standbys too)
    leader: bool


@dataclass(frozen=True)
class ControlPlaneHealth:
    members: list[MemberHealth]
    masters: list[MasterHealth]
    leader: str | None  # the election key's holder, None if none or etcd is down
    api_relay: bool | None  # None: no relay (one master)

    @property
    def ok(self) -> bool:
        """Everything recorded is up, and some master leads."""
        return (
            all(m.alive and m.healthy for m in self.members)
            and all(m.alive and m.serving for m in self.masters)
            and any(m.leader and m.alive for m in self.masters)
            and self.api_relay is not False
        )


def _get(url: str, timeout: float = 3.0) -> int:
    context = ssl.create_default_context()
    context.check_hostname = False  # a status probe: only whether it answers
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


async def _holder(endpoints: str, plane: ControlPlane) -> str | None:
    store = EtcdStore(endpoints, timeout=3.0, tls=plane.etcd_tls())
    try:
        await store.connect()
        kv = await store.get(LEADER_KEY)
    except Exception:
        return None
    finally:
        await store.close()
    return None if kv is None else holder_identity(kv.value)


def reconcile_report(api: Any, names: Iterable[str]) -> dict[str, list[str]]:
    """Per node, the problems its reconcile note names (objects left out, refusals)."""
    from podnet.client import ClientError
    from podnet.model.kinds import NODE

    found = {}
    for name in names:
        try:
            found[name] = reconcile_problems(api.get(NODE, None, name))
        except ClientError:
            found[name] = []
    return found


def control_plane_health(state: ClusterState, plane: ControlPlane) -> ControlPlaneHealth:
    """Probe every recorded member and master now."""
    tls = plane.etcd_tls()
    members = [
        MemberHealth(
            m.name,
            m.process.pid if m.process else 0,
            m.client_port,
            alive(m.process),
            health(f"https://127.0.0.1:{m.client_port}", tls),
        )
        for m in state.etcd_members
    ]
    leader = asyncio.run(_holder(plane.etcd_endpoints(state), plane))
    masters = []
    for m in state.masters:
        pid = m.process.pid if m.process else 0
        base = f"https://127.0.0.1:{m.port}"
        masters.append(
            MasterHealth(
                m.index,
                pid,
                m.port,
                alive(m.process),
                _get(f"{base}/healthz") == 200,
                _get(f"{base}/readyz") == 200,
                bool(leader and pid and leader.endswith(f"-{pid}")),
            )
        )
    relay = alive(state.api_relay) if state.api_port else None
    return ControlPlaneHealth(members, masters, leader, relay)
