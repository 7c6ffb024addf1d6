"""A uid (and the gid of the same number) of its own for each unprivileged local-cluster
pod, from a reserved range, unique on the machine (across clusters).

The kernel is the record: a uid is in use while any process has it as its real,
effective, saved or file-system uid or gid (``/proc/<pid>/status``). Between choosing a
uid and the pod's command running as it, a *claim* holds it: a file
``<CLAIMS>/<uid>`` naming the claiming process (PID and start time), created under a
machine-wide lock and removed once the command runs (or failed to start). A claim whose
process is gone is stale and ignored, so a crash leaks nothing lasting. So a uid is
handed out again only when no process of the pod that had it is left, whatever ended it
(``pod delete``, ``cluster down``, a crash), and the files it wrote went with the pod's
private tmpfs mounts (``podnet.cluster.sandboxmounts``). Uids are taken round-robin from
the last one handed out, as host-local IPAM does with addresses, to delay reuse.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

# 65,536 ids well above any distribution's system and user ranges and below 2^31 (the
# top of ping_group_range); no account in /etc/passwd should ever use them.
POD_UIDS = range(1_000_000_000, 1_000_065_536)
CLAIMS = Path("/run/podnet/pod-uids")  # below /run/podnet: hidden from every pod


class PodUidError(Exception):
    """No uid could be given to a pod (the message says why)."""


def _ids_of(status: str) -> set[int]:
    ids: set[int] = set()
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid"):
            ids.update(int(v) for v in value.split())
    return ids


def ids_in_use(proc: Path = Path("/proc")) -> set[int]:
    """Every uid and gid some process of the machine has (real, effective, saved, fs)."""
    found: set[int] = set()
    for entry in os.scandir(proc):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                found |= _ids_of(Path(entry.path, "status").read_text())
    return found


def _start_time(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rfind(")") + 2 :].split()[19])


def _claim_live(path: Path) -> bool:
    try:
        pid, start = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return False
    return _start_time(pid) == start


def live_claims(claims: Path) -> set[int]:
    """The uids claimed by processes that still run."""
    found = set()
    for path in claims.glob("[0-9]*"):
        if path.name.isdigit() and _claim_live(path):
            found.add(int(path.name))
    return found


def choose(busy: set[int], last: int | None, uids: Iterable[int] = POD_UIDS) -> int:
    """The first uid after ``last`` (round-robin) that is not ``busy``."""
    ordered = list(uids)
    at = ordered.index(last) + 1 if last in ordered else 0
    for uid in ordered[at:] + ordered[:at]:
        if uid not in busy:
            return uid
    raise PodUidError(f"every pod uid ({ordered[0]}..{ordered[-1]}) is in use")


@contextlib.contextmanager
def _locked(claims: Path) -> Iterator[None]:
    claims.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(claims / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def claim(claims: Path = CLAIMS) -> int:
    """A uid no process has and no live claim holds, claimed for this process."""
    with _locked(claims):
        last_file = claims / ".last"
        last = int(last_file.read_text()) if last_file.exists() else None
        uid = choose(ids_in_use() | live_claims(claims), last)
        (claims / str(uid)).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
        last_file.write_text(str(uid))
        return uid


def release_claim(uid: int, claims: Path = CLAIMS) -> None:
    """Drop this process's claim on ``uid`` (its processes, if any, now hold it)."""
    with _locked(claims):
        (claims / str(uid)).unlink(missing_ok=True)


@contextlib.contextmanager
def claimed(claims: Path = CLAIMS) -> Iterator[int]:
    """A claimed uid for the body, which starts the pod's command as it."""
    uid = claim(claims)
    try:
        yield uid
    finally:
        release_claim(uid, claims)
