"""A local-cluster pod whose process ended, as the kubelet reports it (pure, no I/O),
and the kernel's process-exit events that tell it (parsing only).

``terminated_status`` is the Pod status merge patch for a container that exited: phase
``Succeeded`` (exit code 0) or ``Failed``, ``Ready``/``ContainersReady`` False, and the
container's state ``terminated`` with its exit code, reason (``Completed``/``Error``),
signal and times. A process killed by signal N reports exit code 128+N, as the kubelet
does (SIGKILL: 137). When the exit code was not seen (the watcher started after the
process ended) the state says reason ``ContainerStatusUnknown``, exit code 137, and the
phase ``Failed``, as the kubelet says of a container it lost.

``exits`` reads the proc connector's messages (``NETLINK_CONNECTOR``, ``CN_IDX_PROC``):
for each process (not thread) that exited, its PID and wait status.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podnet.cluster.readiness import CONTAINER, ready_conditions

# <linux/connector.h>, <linux/cn_proc.h>
NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_EVENT_EXIT = 0x80000000
_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_EVENT = struct.Struct("=IIQ")  # what, cpu, timestamp_ns
_EXIT = struct.Struct("=IIII")  # pid, tgid, exit_code (a wait status), exit_signal
NLMSG_DONE = 3
UNKNOWN_EXIT = 137  # what the kubelet reports for a container whose end it did not see

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Ended:
    """How a process ended: its exit code (128+N for signal N) and the signal, if any."""

    exit_code: int
    signal: int = 0
    known: bool = True

    @staticmethod
    def from_wait_status(status: int) -> Ended:
        signal = status & 0x7F
        if signal:
            return Ended(128 + signal, signal)
        return Ended((status >> 8) & 0xFF)


UNKNOWN = Ended(UNKNOWN_EXIT, 0, known=False)


def listen_request(pid: int) -> bytes:
    """The message that subscribes a socket to process events, exits only (kernels
    before 6.6 ignore the filter and send every event; ``exits`` skips the others)."""
    op = struct.pack("=II", PROC_CN_MCAST_LISTEN, PROC_EVENT_EXIT)
    cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
    return _NLMSG.pack(_NLMSG.size + len(cn), NLMSG_DONE, 0, 0, pid) + cn


def exits(data: bytes) -> list[tuple[int, int, int]]:
    """(PID, wait status, time in ns since boot) of each process exit in one datagram of
    netlink messages."""
    out = []
    offset = 0
    while offset + _NLMSG.size <= len(data):
        length = _NLMSG.unpack_from(data, offset)[0]
        if length < _NLMSG.size or offset + length > len(data):
            break
        body = offset + _NLMSG.size + _CN_MSG.size
        if body + _EVENT.size + _EXIT.size <= offset + length:
            what, _, stamp = _EVENT.unpack_from(data, body)
            if what == PROC_EVENT_EXIT:
                pid, tgid, status, _ = _EXIT.unpack_from(data, body + _EVENT.size)
                if pid == tgid:  # a process, not one of its threads
                    out.append((tgid, status, stamp))
        offset += (length + 3) & ~3
    return out


def terminated_status(
    ended: Ended, started_at: str, finished_at: str, old_status: Obj | None = None
) -> dict[str, Any]:
    """The Pod status merge patch for its container's end (see the module docstring)."""
    if ended.known:
        reason = "Completed" if ended.exit_code == 0 else "Error"
    else:
        reason = "ContainerStatusUnknown"
    terminated: dict[str, Any] = {
        "exitCode": ended.exit_code,
        "reason": reason,
        "startedAt": started_at,
        "finishedAt": finished_at,
    }
    if ended.signal:
        terminated["signal"] = ended.signal
    old_conditions = (old_status or {}).get("conditions") or []
    return {
        "phase": "Succeeded" if ended.known and ended.exit_code == 0 else "Failed",
        "conditions": ready_conditions(False, finished_at, old_conditions),
        "containerStatuses": [
            {
                "name": CONTAINER,
                "ready": False,
                "started": False,
                "restartCount": 0,
                "image": "podnet/local",
                "imageID": "",
                "state": {"terminated": terminated},
            }
        ],
    }
