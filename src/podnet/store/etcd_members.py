"""Growing the etcd cluster by one member, as ``etcdctl member add`` does, for a master
that joins (``podnet adm join master``).

``add_member`` tells the running members about the new one (its peer URL) before it
starts, so it can start with ``--initial-cluster-state existing`` and the cluster that
``initial_cluster`` spells. Running it again for the same peer URL adds nothing (a join
that failed after this step can be re-run). Note etcd's arithmetic: from one member to
two, the quorum is two, so the cluster waits for the new member to start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from podnet.store.etcd_client import EtcdClient
from podnet.store.etcd_pki import EtcdTls

TIMEOUT = 10


class MembershipError(Exception):
    """The member could not be added."""


@dataclass(frozen=True)
class Member:
    name: str  # empty for a member added but not started yet
    peer_urls: tuple[str, ...]


def initial_cluster(members: Sequence[Member], name: str, peer_url: str) -> str:
    """etcd's ``--initial-cluster`` for the new member ``name`` at ``peer_url``: every
    member's name and peer URLs; a name clash is an error."""
    parts: list[str] = []
    for member in members:
        if peer_url in member.peer_urls:
            continue  # the new member itself, named below
        if member.name == name:
            raise MembershipError(f"etcd has a member named {name!r} already: use --name")
        if not member.name:
            raise MembershipError(
                f"etcd has a member at {', '.join(member.peer_urls)} that never started: "
                "remove it (etcdctl member remove) or start it first"
            )
        parts.extend(f"{member.name}={url}" for url in member.peer_urls)
    parts.append(f"{name}={peer_url}")
    return ",".join(parts)


async def _members(client: EtcdClient) -> list[Member]:
    return [Member(m.name, tuple(m.peer_urls)) async for m in client.members()]


async def add_member(
    endpoints: Sequence[tuple[str, int]], tls: EtcdTls, name: str, peer_url: str
) -> str:
    """Add the member at ``peer_url`` (unless etcd has it already) and return the
    ``--initial-cluster`` it starts with."""
    import aetcd

    client = EtcdClient(endpoints, tls, TIMEOUT)
    try:
        await client.connect()
        members = await _members(client)
        wanted = initial_cluster(members, name, peer_url)  # checks before anything changes
        if not any(peer_url in m.peer_urls for m in members):
            await client.add_member([peer_url])
        return wanted
    except aetcd.exceptions.ClientError as exc:
        raise MembershipError(f"etcd refused the new member: {exc}") from exc
    finally:
        await client.close()
