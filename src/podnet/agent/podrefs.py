"""Which Pod object each attachment belongs to, kept on disk.

ADD answers the runtime first and writes the Pod's IP to the API in the background. An
agent killed in between must not lose that write: the restarted agent reads these
records, matches them with the attachments the kernel still holds, and writes every
healthy pod's status again (the writer skips the PATCH when the Pod already agrees).
A record also says whether the ADD found no Pod (``mirror``): the agent makes that pod's
mirror Pod, and a restarted agent must still make it if the killed one had not; once it
is made the record says so, and a mirror Pod deleted later is never made again.

One small JSON file per (container ID, ifname), named by a digest of the pair. A file is
replaced by rename, never edited, so a reader sees a whole record or none. No fsync: the
records only need to survive the agent process, not the host, because the attachments
they describe (veths in network namespaces) do not survive a reboot either.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

Pair = tuple[str, str]  # (container ID, ifname)
Ref = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Record:
    """One attachment's Pod, and whether its mirror Pod is still to be made (the ADD
    found no Pod, and none has been created for it yet)."""

    ref: Ref
    mirror: bool = False


class PodRefs:
    """The Pod (namespace, name) of every attachment this agent made."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    def record(self, pair: Pair, ref: Ref, mirror: bool = False) -> None:
        """Remember that ``pair`` belongs to Pod ``ref`` (``mirror``: whose mirror Pod the
        agent is still to make)."""
        body: dict[str, object] = {"containerID": pair[0], "ifname": pair[1]}
        body |= {"namespace": ref[0], "name": ref[1]}
        if mirror:
            body["mirror"] = True
        path = self._path(pair)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(body, handle)
        os.replace(tmp, path)

    def forget(self, pair: Pair) -> None:
        """Drop the record of ``pair`` (fine when there is none)."""
        with contextlib.suppress(FileNotFoundError):
            self._path(pair).unlink()

    def load(self) -> dict[Pair, Ref]:
        """Every whole record's Pod; a damaged or stray file is logged and removed."""
        return {pair: record.ref for pair, record in self.load_records().items()}

    def load_records(self) -> dict[Pair, Record]:
        """Every whole record; a damaged or stray file is logged and removed."""
        found: dict[Pair, Record] = {}
        for path in self.directory.iterdir():
            entry = _read(path)
            if entry is None:
                log.warning("removing damaged pod record %s", path)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            pair, record = entry
            found[pair] = record
        return found

    def _path(self, pair: Pair) -> Path:
        digest = hashlib.sha256(f"{pair[0]}\0{pair[1]}".encode()).hexdigest()[:32]
        return self.directory / f"{digest}.json"


def _read(path: Path) -> tuple[Pair, Record] | None:
    if path.name.startswith(".") or path.suffix != ".json":
        return None
    try:
        body = json.loads(path.read_text())
        fields = [body["containerID"], body["ifname"], body["namespace"], body["name"]]
        mirror = body.get("mirror", False)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if not all(isinstance(f, str) for f in fields) or not fields[0] or not fields[3]:
        return None
    if not isinstance(mirror, bool):
        return None
    return (fields[0], fields[1]), Record((fields[2], fields[3]), mirror)
