"""``podnet adm diagnose``: a support bundle of a local cluster or of a real host.

What to collect is a plan, a list of (archive path, producer) pairs built by
:func:`local_plan` (a local cluster's state directory) or :func:`host_plan` (a host run
by systemd); :func:`write_bundle` then runs each producer and writes one ``.tar.gz``.

Bounds: every command runs with a timeout, every member is capped (the cut is noted in
the member and in ``MANIFEST.txt``), and a producer that fails is recorded in
``errors.txt`` while the others go on. Every member passes through
:func:`podnet.cluster.diagnose_redact.redact` (patterns, then every secret found on disk)
before it is written; key files, tokens files and kubeconfigs are never collected. The
archive is created 0600 under a temporary name in the target's directory and renamed
into place once complete.
"""

from __future__ import annotations

import functools
import io
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from podnet import netns
from podnet.cluster.diagnose_redact import redact, redact_object

Producer = Callable[[], str]
Item = tuple[str, Producer]
ApiFactory = Callable[[], Any]  # -> an ApiClient (a context manager with .list)

SIZE_CAP = 20 * 1024 * 1024  # bytes per member
COMMAND_TIMEOUT = 20.0  # seconds per command
LOG_SUFFIXES = (".log",)
HOST_UNITS = (
    "podnet-etcd",
    "podnet-master",
    "podnet-api-relay",
    "podnet-node",
    "podnet-controllers",
    "podnet-router",
)
HOST_SECRET_ROOTS = (Path("/etc/podnet"), Path("/var/lib/podnet"))


class CommandFailed(RuntimeError):
    """A collected command exited non-zero (its output is in the message)."""


def run_command(
    argv: Sequence[str], timeout: float = COMMAND_TIMEOUT, env: dict[str, str] | None = None
) -> str:
    """The command's stdout (stderr appended); CommandFailed when it exits non-zero."""
    done = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    out = done.stdout + (f"\n[stderr]\n{done.stderr}" if done.stderr.strip() else "")
    if done.returncode != 0:
        raise CommandFailed(f"{' '.join(argv)} exited {done.returncode}: {out.strip()[-2000:]}")
    return out


def command(argv: Sequence[str], env: dict[str, str] | None = None) -> Producer:
    return lambda: run_command(argv, env=env)


def read_tail(path: Path, cap: int = SIZE_CAP) -> str:
    """A file's text, or its last ``cap`` bytes with a note when it is longer."""
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - cap))
        data = f.read(cap)
    text = data.decode(errors="replace")
    if size > cap:
        return f"[podnet diagnose: first {size - cap} of {size} bytes omitted]\n" + text
    return text


def is_log(path: Path) -> bool:
    """``x.log`` or a rotated ``x.log.1``."""
    name = path.name
    return name.endswith(LOG_SUFFIXES) or any(f"{s}." in name for s in LOG_SUFFIXES)


def log_files(root: Path) -> list[Path]:
    """Every regular log file under ``root`` (symlinks not followed), sorted."""
    found = []
    for top, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in names:
            path = Path(top) / name
            if is_log(path) and path.is_file() and not path.is_symlink():
                found.append(path)
    return sorted(found)


def dump_objects(api_factory: ApiFactory, kinds: Iterable[Any]) -> list[Item]:
    """One YAML member per kind: the kind's List, all namespaces, credential keys redacted."""

    def dump(kind: Any) -> Producer:
        def produce() -> str:
            with api_factory() as api:
                found = api.list(kind)
            return yaml.safe_dump(redact_object(found), sort_keys=False)

        return produce

    return [(f"objects/{kind.plural}.yaml", dump(kind)) for kind in kinds]


def network_items(prefix: str, wrap: Callable[[list[str]], list[str]]) -> list[Item]:
    """Routes, links and addresses where ``wrap`` runs a command (a namespace or here)."""
    return [
        (f"{prefix}/ip-route.txt", command(wrap(["ip", "route", "show", "table", "all"]))),
        (f"{prefix}/ip-link.txt", command(wrap(["ip", "-d", "link"]))),
        (f"{prefix}/ip-addr.txt", command(wrap(["ip", "addr"]))),
    ]


def ovs_flows(base: Path) -> Producer:
    """``ovs-ofctl dump-flows br0`` of the OVS instance under ``base`` (its own sockets)."""
    from podnet.dataplane.ovs.daemons import binary
    from podnet.dataplane.ovs.instance import OvsPaths
    from podnet.dataplane.ovs.tables import BRIDGE

    def produce() -> str:
        argv = [binary("ovs-ofctl"), "-O", "OpenFlow13", "--no-names", "dump-flows", BRIDGE]
        return run_command(argv, env=OvsPaths(base).env())

    return produce


def local_plan(state_dir: Path, api_factory: ApiFactory) -> list[Item]:
    """What to collect from the local cluster at ``state_dir``."""
    from podnet.cluster.ovsnodes import node_ovs_base
    from podnet.cluster.state import ClusterState
    from podnet.model.kinds import KINDS

    state = ClusterState.load(state_dir)
    if state is None:
        raise ValueError(f"no cluster at {state_dir} (no state.json)")
    items: list[Item] = [("state.json", (state_dir / "state.json").read_text)]
    for path in log_files(state_dir):
        items.append((f"logs/{path.relative_to(state_dir).as_posix()}", _tail(path)))
    status = [sys.executable, "-m", "podnet", "cluster", "status", "--state-dir", str(state_dir)]
    items.append(("cluster-status.txt", lambda: _status(status)))
    items += dump_objects(api_factory, KINDS.kinds)
    nodes = {node.netns: node.name for node in state.nodes.values()}
    for ns in state.namespaces:
        prefix = f"nodes/{nodes[ns]}" if ns in nodes else f"netns/{ns}"
        items += network_items(prefix, functools.partial(netns.command, ns))
        if ns in nodes:
            ruleset = netns.command(ns, ["nft", "list", "ruleset"])
            items.append((f"{prefix}/nft-ruleset.txt", command(ruleset)))
            if state.dataplane == "ovs":
                base = node_ovs_base(state_dir, nodes[ns])
                items.append((f"{prefix}/ovs-flows.txt", ovs_flows(base)))
    return items


def host_plan(api_factory: ApiFactory | None, units: Sequence[str] = HOST_UNITS) -> list[Item]:
    """What to collect from a real host: its units' journals, its network, the objects."""
    from podnet.model.kinds import KINDS

    items: list[Item] = []
    for unit in units:
        argv = ["journalctl", "--no-pager", "-o", "short-iso", "-n", "50000", "-u", unit]
        items.append((f"logs/{unit}.log", command(argv)))
    items += network_items("host", lambda argv: argv)
    items.append(("host/nft-ruleset.txt", command(["nft", "list", "ruleset"])))
    if Path("/var/run/openvswitch/br0.mgmt").exists():
        flows = ["ovs-ofctl", "-O", "OpenFlow13", "--no-names", "dump-flows", "br0"]
        items.append(("host/ovs-flows.txt", command(flows)))
    if api_factory is not None:
        items += dump_objects(api_factory, KINDS.kinds)
    return items


def _tail(path: Path) -> Producer:
    return lambda: read_tail(path)


def _status(argv: list[str]) -> str:
    """``cluster status``'s output whatever its exit code (1 means something is down)."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT * 3)
    return f"$ podnet cluster status  (exit {done.returncode})\n{done.stdout}{done.stderr}"


@dataclass
class BundleReport:
    """What went into the bundle: members with sizes, cut members, errors."""

    members: dict[str, int] = field(default_factory=dict)
    cut: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def manifest(self) -> str:
        lines = [f"{size:>10}  {name}" for name, size in self.members.items()]
        lines += [f"cut at the size cap: {name}" for name in self.cut]
        return "\n".join(lines) + "\n"


def cap_text(text: str, cap: int) -> tuple[bytes, bool]:
    """The UTF-8 bytes of ``text``, cut to ``cap`` with a note at the end when longer."""
    data = text.encode()
    if len(data) <= cap:
        return data, False
    note = f"\n[podnet diagnose: cut at {cap} of {len(data)} bytes]\n".encode()
    return data[:cap] + note, True


def _add(tar: tarfile.TarFile, name: str, data: bytes, now: float) -> None:
    info = tarfile.TarInfo(f"podnet-diagnose/{name}")
    info.size, info.mode, info.mtime = len(data), 0o600, int(now)
    tar.addfile(info, io.BytesIO(data))


def write_bundle(
    out: Path,
    items: Sequence[Item],
    secrets: Iterable[str],
    cap: int = SIZE_CAP,
    progress: Callable[[str], None] | None = None,
) -> BundleReport:
    """Run every producer, redact, cap, and write the archive (0600, atomically)."""
    known = sorted(set(secrets), key=len, reverse=True)
    report = BundleReport()
    now = time.time()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz") as tar:
                for name, produce in items:
                    if progress is not None:
                        progress(name)
                    try:
                        text = produce()
                    except Exception as exc:
                        report.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                        continue
                    data, cut = cap_text(redact(text, known), cap)
                    if cut:
                        report.cut.append(name)
                    report.members[name] = len(data)
                    _add(tar, name, data, now)
                errors = "\n".join(report.errors) + "\n" if report.errors else "no errors\n"
                _add(tar, "errors.txt", redact(errors, known).encode(), now)
                _add(tar, "MANIFEST.txt", report.manifest().encode(), now)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return report
