"""The sandbox of a local-cluster pod's processes: their own mount namespace, with
podnet's state directories hidden, and an unprivileged user unless asked otherwise.

A pod process is started as::

    nsenter --net=<pod netns> -- unshare --mount --propagation private -- \\
        python -m podnet.cluster.sandbox --uid U --gid G [--etc DIR] [--volume SRC:DST]... \\
        --hide DIR... -- COMMAND...

Inside the new mount namespace (private: nothing propagates back to the host) this module
first bind-mounts each file of the ``--etc`` directory (``/etc/netns/<pod netns>``: the
pod's ``resolv.conf``) over the file of that name in ``/etc``, as ``ip netns exec`` does,
binds each ``--volume`` host directory over its existing target (the router's files),
then mounts an empty read-only tmpfs over each hidden directory (the cluster's state dir with
the master's tokens, keys and kubeconfigs, the nodes' kubeconfigs and CNI sockets, etcd's
data; podnet's default directories). Each ``--expose`` directory (the Python interpreter
and podnet, which ``U`` must be able to run) that lies below a directory others cannot
enter (``/root`` for a pyenv Python) is made reachable: that closed directory is covered
by a tmpfs holding only bind mounts of the exposed directories, so the rest of it (root's
home: kubeconfigs, keys) stays out of sight. Then it moves to ``/``, drops to ``U:G`` with no
supplementary groups and ``no_new_privs`` (so no setuid or file-capability binary gives
root back), and executes COMMAND in place: the PID the cluster records is COMMAND's.

Only stdlib imports at module level: this runs once per pod process and per exec.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import stat
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534  # nobody:nogroup
ROOT = 0
# podnet's own default places (master, node, cluster state; the CNI socket; IPAM), hidden
# whether or not this cluster uses them.
DEFAULT_HIDDEN = (
    Path("/var/lib/podnet"),
    Path("/run/podnet"),
    Path("/var/run/podnet"),
    Path("/var/lib/cni"),
)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
PR_SET_NO_NEW_PRIVS = 38
# Per pod network namespace (as Docker sets them): an unprivileged server may bind
# ports below 1024, and ping works through ICMP datagram sockets, without capabilities.
POD_SYSCTLS = ("net.ipv4.ip_unprivileged_port_start=0", "net.ipv4.ping_group_range=0 2147483647")


class SandboxError(Exception):
    """The sandbox could not be set up (the message says which step failed)."""


@dataclass(frozen=True)
class Sandbox:
    """Who a pod's processes run as and what they must not see."""

    hide: tuple[Path, ...]
    uid: int = NOBODY
    gid: int = NOBODY
    expose: tuple[Path, ...] = ()
    etc: Path | None = None  # files bound over /etc's (the pod's resolv.conf)
    volumes: tuple[tuple[Path, Path], ...] = ()  # (host directory, where the pod sees it)

    def wrap(self, netns_path: Path | str, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside the pod's network namespace and this sandbox."""
        hidden = [arg for path in self.hide for arg in ("--hide", str(path))]
        hidden += [arg for path in self.expose for arg in ("--expose", str(path))]
        hidden += ["--etc", str(self.etc)] if self.etc is not None else []
        hidden += [arg for src, dst in self.volumes for arg in ("--volume", f"{src}:{dst}")]
        return [
            "nsenter",
            f"--net={netns_path}",
            "--",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            sys.executable,
            "-m",
            __name__,
            "--uid",
            str(self.uid),
            "--gid",
            str(self.gid),
            *hidden,
            "--",
            *argv,
        ]


def hidden_paths(extra: Iterable[Path]) -> tuple[Path, ...]:
    """``extra`` and ``DEFAULT_HIDDEN``, resolved, only existing directories, and none
    inside another (a tmpfs over the parent already hides it), sorted."""
    found = {Path(os.path.realpath(p)) for p in (*extra, *DEFAULT_HIDDEN)}
    return tuple(outermost(p for p in found if p.is_dir() and p != Path("/")))


def interpreter_paths() -> tuple[Path, ...]:
    """What a pod's user needs to run this Python and podnet: the interpreter's prefix,
    the virtual environment, and the directory podnet is imported from."""
    import podnet

    package_root = Path(podnet.__file__).resolve().parents[1]
    found = {Path(os.path.realpath(p)) for p in (sys.base_prefix, sys.prefix, package_root)}
    return tuple(sorted(found))


def closed_ancestor(path: Path) -> Path | None:
    """The topmost directory above ``path`` that others may not enter (no ``o+x``)."""
    for ancestor in reversed(path.parents[:-1]):  # from the top, without "/"
        if not ancestor.stat().st_mode & stat.S_IXOTH:
            return ancestor
    return None


def outermost(paths: Iterable[Path]) -> list[Path]:
    """``paths`` without those inside another of them, sorted."""
    found = sorted(set(paths))
    return [p for p in found if not any(p != q and p.is_relative_to(q) for q in found)]


def pod_environment() -> dict[str, str]:
    """The environment of a pod's processes: a path and a locale, nothing of the caller's
    (which may carry a kubeconfig location or credentials). PYTHONPATH is kept, so a
    source checkout run with it still finds this module."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    env |= {"HOME": "/", "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def process_ids(pid: int) -> tuple[int, int] | None:
    """The real uid and gid of process ``pid`` (None if it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    ids = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid"):
            ids[key] = int(value.split()[0])
    return (ids["Uid"], ids["Gid"]) if len(ids) == 2 else None


# --- inside the sandbox ------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _bytes(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


def _mount(source: str | None, target: Path, fstype: str | None, flags: int, data: str) -> None:
    if _libc.mount(_bytes(source), bytes(target), _bytes(fstype), flags, _bytes(data)) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"mounting {source or fstype} on {target}: {os.strerror(err)}")


def _mount_empty(path: Path) -> None:
    _mount(
        "tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555"
    )


def _expose(paths: Iterable[Path]) -> None:
    """Cover each closed directory above ``paths`` with a tmpfs that holds only bind
    mounts of the exposed directories inside it (taken by fd before the cover)."""
    covers: dict[Path, list[Path]] = {}
    for path in outermost(paths):
        if (closed := closed_ancestor(path)) is not None:
            covers.setdefault(closed, []).append(path)
    for closed, inside in covers.items():
        handles = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in inside}
        _mount("tmpfs", closed, "tmpfs", MS_NOSUID | MS_NODEV, "size=4k,mode=0711")
        for path, fd in handles.items():
            os.makedirs(path, mode=0o711, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, "")
            os.close(fd)
        flags = MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
        _mount(None, closed, None, flags, "size=4k,mode=0711")


def _drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SandboxError(f"no_new_privs: {os.strerror(ctypes.get_errno())}")


def _bind_etc(directory: Path) -> None:
    """Bind each regular file of ``directory`` over the existing file of that name in
    /etc (dot files, and names /etc lacks, are skipped)."""
    for name in sorted(os.listdir(directory)):
        source, target = directory / name, Path("/etc") / name
        if not name.startswith(".") and source.is_file() and target.exists():
            _mount(str(source), target, None, MS_BIND, "")


def enter(sandbox: Sandbox, argv: Sequence[str]) -> None:
    """Bind the pod's /etc files, hide, move to /, drop privileges and exec ``argv``
    (returns only by raising)."""
    if sandbox.etc is not None:
        _bind_etc(sandbox.etc)
    for source, target in sandbox.volumes:  # before hiding: a source may lie in a hidden dir
        _mount(str(source), target, None, MS_BIND | MS_REC, "")
    for path in sandbox.hide:
        _mount_empty(path)
    _expose(sandbox.expose)  # after hiding: a hidden directory inside stays hidden (MS_REC)
    os.chdir("/")  # a working directory inside a hidden one would still be open
    if sandbox.uid != ROOT:
        _drop_privileges(sandbox.uid, sandbox.gid)
    os.execvp(argv[0], list(argv))


def main(args: Sequence[str] | None = None) -> int:
    """Entry point (see the module docstring); runs as root in a fresh mount namespace."""
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--uid", type=int, default=NOBODY)
    parser.add_argument("--gid", type=int, default=NOBODY)
    parser.add_argument("--hide", type=Path, action="append", default=[])
    parser.add_argument("--expose", type=Path, action="append", default=[])
    parser.add_argument("--etc", type=Path)
    parser.add_argument("--volume", action="append", default=[], help="SRC:DST, bound first")
    parser.add_argument("command", nargs="+")
    opts = parser.parse_args(args)
    try:
        volumes = tuple((Path(v.split(":")[0]), Path(v.split(":")[1])) for v in opts.volume)
        sandbox = Sandbox(
            tuple(opts.hide), opts.uid, opts.gid, tuple(opts.expose), opts.etc, volumes
        )
        enter(sandbox, opts.command)
    except (OSError, SandboxError) as exc:
        print(f"pod sandbox: {exc}", file=sys.stderr)
        return 126
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
