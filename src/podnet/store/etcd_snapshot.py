"""Back up and restore etcd with ``etcdctl snapshot`` (Debian's etcd-client, etcd 3.4).

``save`` asks one member for a snapshot into a private temporary directory next to the
output (0700), makes the file 0600 (it holds every object of the cluster, Secrets and
service-account tokens included), checks it (the sha256 etcdctl appends, and
``etcdctl snapshot status``) and only then renames it into place, so the output is
either the old file or a verified one.

``restore`` builds a new data directory for one member from a snapshot: it refuses a
``--data-dir`` that exists and is not an empty directory, checks the snapshot the same
way, lets ``etcdctl snapshot restore`` (which checks the hash again) write into
a private temporary directory beside the target and renames that into place. On any
error nothing outside the temporary directory has changed.

etcdctl gets its endpoint and TLS files through ``ETCDCTL_*`` environment variables, not
its command line; only paths are passed, never a key or a password.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from podnet.store.etcd_pki import EtcdTls

ETCDCTL = "/usr/bin/etcdctl"
SAVE_TIMEOUT = 300.0  # seconds for one member to stream its snapshot
STATUS_TIMEOUT = 120.0
HASH_SIZE = 32  # the sha256 ``etcdctl snapshot save`` appends to the database
PROBE_TIMEOUT = 5  # seconds for a member to answer before the next one is asked
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

__all__ = [
    "ETCDCTL",
    "RestorePlan",
    "SnapshotError",
    "SnapshotStatus",
    "etcdctl_env",
    "next_steps",
    "restore",
    "restore_argv",
    "save",
    "status",
]


class SnapshotError(Exception):
    """A backup or restore cannot be done (the message says why; nothing was changed)."""


@dataclass(frozen=True)
class SnapshotStatus:
    """What ``etcdctl snapshot status`` reports of a snapshot file."""

    hash: int
    revision: int
    total_keys: int
    total_size: int

    def describe(self) -> str:
        return (
            f"revision {self.revision}, {self.total_keys} keys, {self.total_size} bytes, "
            f"hash {self.hash:08x}"
        )


@dataclass(frozen=True)
class RestorePlan:
    """The member a restored data directory is for (etcdctl's flags of the same names)."""

    data_dir: Path
    name: str
    peer_urls: tuple[str, ...]  # --initial-advertise-peer-urls
    initial_cluster: str = ""  # --initial-cluster; empty: just this member
    cluster_token: str = "podnet"  # --initial-cluster-token

    @property
    def cluster(self) -> str:
        return self.initial_cluster or ",".join(f"{self.name}={u}" for u in self.peer_urls)


# ---- pure parts ---------------------------------------------------------------------------


def etcdctl_env(
    base: Mapping[str, str], endpoint: str | None = None, tls: EtcdTls | None = None
) -> dict[str, str]:
    """etcdctl's environment: ``base`` without any ``ETCDCTL_*`` of the caller's, plus the
    v3 API, the endpoint (``host:port``; https when ``tls``) and the TLS file paths."""
    env = {k: v for k, v in base.items() if not k.startswith("ETCDCTL_")}
    env["ETCDCTL_API"] = "3"
    if endpoint is not None:
        scheme = "https" if tls is not None else "http"
        env["ETCDCTL_ENDPOINTS"] = f"{scheme}://{endpoint}"
        env["ETCDCTL_DIAL_TIMEOUT"] = f"{PROBE_TIMEOUT}s"
        env["ETCDCTL_COMMAND_TIMEOUT"] = f"{PROBE_TIMEOUT}s"
    if tls is not None:
        env["ETCDCTL_CACERT"] = str(tls.ca)
        env["ETCDCTL_CERT"] = str(tls.cert)
        env["ETCDCTL_KEY"] = str(tls.key)
    return env


def _check_url(url: str, flag: str) -> None:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise SnapshotError(f"{flag}: want http(s)://host:port, got {url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise SnapshotError(f"{flag}: want http(s)://host:port, got {url!r}")


def check_plan(plan: RestorePlan) -> None:
    """Refuse a member name, peer URL or --initial-cluster etcd would not start with."""
    if not NAME.match(plan.name):
        raise SnapshotError(f"--name: letters, digits, '.', '_' and '-' only, got {plan.name!r}")
    if not plan.peer_urls:
        raise SnapshotError("--initial-advertise-peer-urls: give this member's peer URL")
    for url in plan.peer_urls:
        _check_url(url, "--initial-advertise-peer-urls")
    if not plan.cluster_token or "," in plan.cluster_token:
        raise SnapshotError(f"--initial-cluster-token: got {plan.cluster_token!r}")
    members: dict[str, list[str]] = {}
    for entry in plan.cluster.split(","):
        name, sep, url = entry.strip().partition("=")
        if not sep or not NAME.match(name):
            raise SnapshotError(f"--initial-cluster: want name=peer-url,..., got {entry!r}")
        _check_url(url, "--initial-cluster")
        members.setdefault(name, []).append(url)
    if sorted(members.get(plan.name, [])) != sorted(plan.peer_urls):
        raise SnapshotError(
            f"--initial-cluster must list {plan.name} with exactly its "
            f"--initial-advertise-peer-urls ({','.join(plan.peer_urls)})"
        )


def restore_argv(snapshot: Path, target: Path, plan: RestorePlan) -> list[str]:
    """``etcdctl snapshot restore`` for ``plan``, writing into ``target``."""
    return [
        ETCDCTL,
        *("snapshot", "restore", str(snapshot), "--data-dir", str(target)),
        *("--name", plan.name, "--initial-cluster", plan.cluster),
        *("--initial-cluster-token", plan.cluster_token),
        *("--initial-advertise-peer-urls", ",".join(plan.peer_urls)),
    ]


def parse_status(text: str) -> SnapshotStatus:
    """``etcdctl snapshot status -w json``'s answer."""
    try:
        data = json.loads(text)
        return SnapshotStatus(
            int(data["hash"]), int(data["revision"]), int(data["totalKey"]), int(data["totalSize"])
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"etcdctl snapshot status answered {text.strip()[:200]!r}") from exc


def why(stderr: str) -> str:
    """etcdctl's reason for a failure: its ``Error:`` line, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("Error:"):
            return line.removeprefix("Error:").strip()
    return lines[-1] if lines else "no reason given"


def next_steps(plan: RestorePlan) -> list[str]:
    """What to do after a restore, for the message the command prints."""
    return [
        "stop every podnet master and every etcd member of the cluster first;",
        f"restore the same snapshot for each member (its own --name and "
        f"--initial-advertise-peer-urls, the same --initial-cluster {plan.cluster} "
        f"and --initial-cluster-token {plan.cluster_token});",
        f"start etcd on {plan.data_dir} with --name {plan.name}, "
        f"--initial-advertise-peer-urls {','.join(plan.peer_urls)}, the same "
        "--initial-cluster and --initial-cluster-token (the podnet-etcd unit reads "
        "/var/lib/etcd/podnet: move the old one aside and this one there, owned by etcd);",
        "then start the masters; everything written after the backup is gone "
        "(nodes re-register, pods made since are lost).",
    ]


# ---- running etcdctl ---------------------------------------------------------------------


def _etcdctl() -> str:
    if not os.access(ETCDCTL, os.X_OK):
        raise SnapshotError(f"{ETCDCTL} not found: apt-get install etcd-client")
    return ETCDCTL


def _run(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> str:
    try:
        done = subprocess.run(
            list(argv),
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise SnapshotError(f"etcdctl {argv[1]} {argv[2]} took over {timeout:g}s") from exc
    if done.returncode != 0:
        raise SnapshotError(why(done.stderr or done.stdout))
    return done.stdout


def integrity_problem(snapshot: Path) -> str | None:
    """Why the sha256 that ``snapshot save`` appends does not vouch for the file (None:
    it does). The database is whole 512-byte pages, so the hash is the last 32 bytes
    exactly when the size is 32 more than a multiple of 512 (as etcdctl decides)."""
    size = snapshot.stat().st_size
    if size % 512 != HASH_SIZE or size < 512 + HASH_SIZE:
        return "it has no integrity hash (not a file of `etcdctl snapshot save`)"
    digest = hashlib.sha256()
    with open(snapshot, "rb") as handle:
        left = size - HASH_SIZE
        while left:
            chunk = handle.read(min(left, 1 << 20))
            if not chunk:
                return "it changed while it was read"
            digest.update(chunk)
            left -= len(chunk)
        if not hmac.compare_digest(digest.digest(), handle.read(HASH_SIZE)):
            return "its integrity hash does not match its content (corrupt or truncated)"
    return None


def status(snapshot: Path) -> SnapshotStatus:
    """Check a snapshot file: its integrity hash, then ``etcdctl snapshot status``."""
    if not snapshot.is_file():
        raise SnapshotError(f"no such snapshot file: {snapshot}")
    if problem := integrity_problem(snapshot):
        raise SnapshotError(f"{snapshot} is not a usable etcd snapshot: {problem}")
    argv = [_etcdctl(), "snapshot", "status", str(snapshot), "-w", "json"]
    try:
        return parse_status(_run(argv, etcdctl_env(os.environ), STATUS_TIMEOUT))
    except SnapshotError as exc:
        raise SnapshotError(f"{snapshot} is not a usable etcd snapshot: {exc}") from exc


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(endpoints: Sequence[str], tls: EtcdTls | None, output: Path) -> SnapshotStatus:
    """Snapshot etcd into ``output`` (0600, atomic, verified), asking the members in turn
    until one answers."""
    etcdctl = _etcdctl()
    if output.is_dir():
        raise SnapshotError(f"{output} is a directory; give a file name")
    if not output.parent.is_dir():
        raise SnapshotError(f"no such directory: {output.parent}")
    if not endpoints:
        raise SnapshotError("no etcd endpoint to back up from")
    scratch = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        part = scratch / "snapshot.db"
        failures = []
        for endpoint in endpoints:
            env = etcdctl_env(os.environ, endpoint, tls)
            try:
                # snapshot save waits for ever on a member that does not answer; this
                # answers within the command timeout
                _run([etcdctl, "endpoint", "status"], env, PROBE_TIMEOUT + 5)
                _run([etcdctl, "snapshot", "save", str(part)], env, SAVE_TIMEOUT)
                break
            except SnapshotError as exc:
                failures.append(f"{endpoint}: {exc}")
        else:
            raise SnapshotError("no etcd member gave a snapshot: " + "; ".join(failures))
        os.chmod(part, 0o600)
        found = status(part)
        _sync(part)
        os.replace(part, output)
        _sync(output.parent)
        return found
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _refuse_existing(data_dir: Path) -> None:
    if data_dir.is_symlink() or (data_dir.exists() and not data_dir.is_dir()):
        raise SnapshotError(
            f"refusing to restore into {data_dir}: it exists and is not a directory"
        )
    if data_dir.is_dir() and any(data_dir.iterdir()):
        raise SnapshotError(
            f"refusing to restore into {data_dir}: it is not empty (restore into a new directory)"
        )
    if not data_dir.parent.is_dir():
        raise SnapshotError(f"no such directory: {data_dir.parent}")


def restore(snapshot: Path, plan: RestorePlan) -> SnapshotStatus:
    """Make ``plan.data_dir`` (0700) from ``snapshot`` for member ``plan.name``."""
    _etcdctl()
    check_plan(plan)
    data_dir = plan.data_dir
    _refuse_existing(data_dir)
    found = status(snapshot)
    scratch = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}.restore-", dir=data_dir.parent))
    try:
        target = scratch / "data"
        argv = restore_argv(snapshot, target, plan)
        try:
            _run(argv, etcdctl_env(os.environ), SAVE_TIMEOUT)
        except SnapshotError as exc:
            raise SnapshotError(f"etcdctl snapshot restore failed: {exc}") from exc
        os.chmod(target, 0o700)
        try:
            os.replace(target, data_dir)  # replaces only a still-empty directory
        except OSError as exc:
            raise SnapshotError(f"cannot move the restored data to {data_dir}: {exc}") from exc
        with contextlib.suppress(OSError):
            _sync(data_dir.parent)
        return found
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
