"""The sandbox of a local-cluster pod's processes, as the host starts it.

A pod's command is started as::

    python -m podnet.cluster.sandbox run --netns <pod netns> --uid U --gid G \\
        [--etc DIR] [--volume SRC:DST]... --hide DIR... --expose DIR... --report-fd N \\
        -- COMMAND...

which enters the pod's network namespace and gives the pod its own mount, PID and IPC
namespaces (``podnet.cluster.sandboxrun``): an init as PID 1, the command as PID 2 run
as ``U:G`` (a uid of its own, ``podnet.cluster.poduids``; root for a privileged pod) with
no capabilities and ``no_new_privs``, seeing podnet's state hidden, its own ``/tmp``,
``/var/tmp``, ``/dev/shm`` and ``/run/lock``, and its own ``/proc``
(``podnet.cluster.sandboxmounts``). The host PIDs of init and of the command are written
to fd N; the command's is the one the cluster records.

``pod exec`` and command readiness checks run::

    python -m podnet.cluster.sandbox exec --pid P --start S -- COMMAND...

inside the namespaces of the running pod whose command is P (started at S), as its user.

Only stdlib imports at module level: this runs once per pod process and per exec.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from podnet.cluster.sandboxmounts import FsView, closed_ancestor, outermost
from podnet.cluster.sandboxsys import SandboxError

__all__ = [
    "DEFAULT_HIDDEN",
    "NOBODY",
    "POD_SYSCTLS",
    "ROOT",
    "Sandbox",
    "SandboxError",
    "closed_ancestor",
    "exec_argv",
    "hidden_paths",
    "interpreter_paths",
    "outermost",
    "pod_environment",
    "process_ids",
]

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
# Per pod network namespace (as Docker sets them): an unprivileged server may bind
# ports below 1024, and ping works through ICMP datagram sockets, without capabilities.
POD_SYSCTLS = ("net.ipv4.ip_unprivileged_port_start=0", "net.ipv4.ping_group_range=0 2147483647")


@dataclass(frozen=True)
class Sandbox:
    """Who a pod's processes run as and what they must not see."""

    hide: tuple[Path, ...]
    uid: int = NOBODY
    gid: int = NOBODY
    expose: tuple[Path, ...] = ()
    etc: Path | None = None  # files bound over /etc's (the pod's resolv.conf)
    volumes: tuple[tuple[Path, Path], ...] = ()  # (host directory, where the pod sees it)

    def wrap(self, netns_path: Path | str, argv: Sequence[str], report_fd: int = 1) -> list[str]:
        """``argv`` as started in a new sandbox in the pod's network namespace; the host
        PIDs of its init and command are written to ``report_fd``."""
        hidden = [arg for path in self.hide for arg in ("--hide", str(path))]
        hidden += [arg for path in self.expose for arg in ("--expose", str(path))]
        hidden += ["--etc", str(self.etc)] if self.etc is not None else []
        hidden += [arg for src, dst in self.volumes for arg in ("--volume", f"{src}:{dst}")]
        return [
            sys.executable,
            "-m",
            __name__,
            "run",
            "--netns",
            str(netns_path),
            "--uid",
            str(self.uid),
            "--gid",
            str(self.gid),
            *hidden,
            "--report-fd",
            str(report_fd),
            "--",
            *argv,
        ]


def exec_argv(pid: int, start: int, argv: Sequence[str]) -> list[str]:
    """``argv`` as run inside the running pod whose command is ``pid`` (started at
    ``start``, /proc clock ticks), as that command's user."""
    where = ["--pid", str(pid), "--start", str(start)]
    return [sys.executable, "-m", __name__, "exec", *where, "--", *argv]


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


def _arguments(args: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    verbs = parser.add_subparsers(dest="verb", required=True)
    run = verbs.add_parser("run", help="start a pod's command in a new sandbox")
    run.add_argument("--netns", type=Path, required=True, help="the pod's network namespace")
    run.add_argument("--uid", type=int, required=True)
    run.add_argument("--gid", type=int, required=True)
    run.add_argument("--hide", type=Path, action="append", default=[])
    run.add_argument("--expose", type=Path, action="append", default=[])
    run.add_argument("--etc", type=Path)
    run.add_argument("--volume", action="append", default=[], help="SRC:DST, bound first")
    run.add_argument("--report-fd", type=int, required=True)
    run.add_argument("command", nargs="+")
    into = verbs.add_parser("exec", help="run a command in a running pod's sandbox")
    into.add_argument("--pid", type=int, required=True, help="the pod's command (host PID)")
    into.add_argument("--start", type=int, required=True, help="its /proc start time")
    into.add_argument("command", nargs="+")
    return parser.parse_args(args)


def _volume(text: str) -> tuple[Path, Path]:
    source, sep, target = text.partition(":")
    if not (sep and source.startswith("/") and target.startswith("/")):
        raise SandboxError(f"volume {text!r} is not SRC:DST with two absolute paths")
    return Path(source), Path(target)


def main(args: Sequence[str] | None = None) -> int:
    """Entry point (see the module docstring); runs as root on the host."""
    from podnet.cluster import sandboxrun

    opts = _arguments(args)
    try:
        if opts.verb == "exec":
            return sandboxrun.exec_in(opts.pid, opts.start, opts.command)
        volumes = tuple(_volume(v) for v in opts.volume)
        view = FsView(tuple(opts.hide), tuple(opts.expose), opts.etc, volumes)
        ids = (opts.uid, opts.gid)
        sandboxrun.run(view, opts.netns, ids, opts.command, opts.report_fd)
    except (OSError, SandboxError) as exc:
        print(f"pod sandbox: {exc}", file=sys.stderr)
        return 126
    return 0


if __name__ == "__main__":
    sys.exit(main())
