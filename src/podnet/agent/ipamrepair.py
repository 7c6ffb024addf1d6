"""Repair of damaged host-local reservation files (empty or garbled).

podnet writes reservation files atomically, but a file torn by an older podnet, by the
reference plugin killed mid-write, or by a disk fault can still be found. Such a file
names no owner, so nothing could release it, and it once made the agent fail at every
start. The node knows whose address it is from the kernel: an attachment with that
address owns it (the file is rewritten for that attachment); with none, no pod uses the
address (the file is removed). Either way the repair is logged and reported.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address

from podnet.dataplane.interface import PodAttachment
from podnet.ipam.hostlocal import HostLocalStore

log = logging.getLogger("podnet.agent.ipamrepair")

Report = Callable[[str], None]


@dataclass(frozen=True)
class RepairPlan:
    """Damaged files to rewrite for their attachment, and damaged files to remove."""

    rewrite: dict[IPv4Address, PodAttachment]
    discard: list[IPv4Address]


def plan_repairs(
    damaged: Mapping[IPv4Address, str], attachments: Iterable[PodAttachment]
) -> RepairPlan:
    """Whose each damaged address is: the attachment holding it, or nobody."""
    holder = {a.address.ip: a for a in attachments}
    rewrite = {ip: holder[ip] for ip in damaged if ip in holder}
    return RepairPlan(rewrite, sorted(ip for ip in damaged if ip not in holder))


def _describe(text: str) -> str:
    return "empty" if not text else f"garbled ({text[:40]!r})"


async def repair_damaged(
    store: HostLocalStore, attachments: Iterable[PodAttachment], report: Report | None, why: str
) -> RepairPlan:
    """Find damaged reservation files and repair them per ``plan_repairs``; each repair
    is logged as a warning and passed to ``report`` (an Event on the Node)."""
    damaged = await asyncio.to_thread(store.damaged)
    plan = plan_repairs(damaged, attachments)
    for ip, a in plan.rewrite.items():
        if await asyncio.to_thread(store.repair, ip, a.container_id, a.ifname):
            _tell(
                report,
                f"{why}: IPAM file {ip} was {_describe(damaged[ip])}; rewritten for "
                f"{a.container_id}/{a.ifname}, which has that address",
            )
    for ip in plan.discard:
        if await asyncio.to_thread(store.discard, ip):
            _tell(
                report,
                f"{why}: IPAM file {ip} was {_describe(damaged[ip])} and no pod "
                "has that address; removed",
            )
    return plan


def _tell(report: Report | None, message: str) -> None:
    log.warning("%s", message)
    if report is not None:
        report(message)
