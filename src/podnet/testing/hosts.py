"""Hand-made hosts for the tests of the real-host guide: each host is a network namespace
on a shared underlay bridge, with a mount namespace of its own and a host name of its own.

A host sees the machine's file system, except that ``/etc``, ``/var/lib``, ``/opt`` and
``/usr/local`` are overlays whose upper layers are the host's (what a host writes to
``/etc/podnet``, ``/var/lib/podnet``, ``/etc/cni``, ``/opt/podnet`` or
``/usr/local/sbin`` only it sees, and the machine's directories never change), and
``/run/podnet`` is a directory of the host's. Mounts the machine has below the overlaid
directories are moved back on top. Its network namespace has one link, ``eth0``, on the
underlay ``10.0.0.0/24`` (the guide's addresses), and a default route through
``10.0.0.1`` (the underlay namespace's bridge), so a daemon that looks for its address
on the default route's link finds it.

Commands run in a host through ``nsenter`` (network, mount and UTS namespaces), as the
guide's commands are written; daemons are recorded by PID and stopped by PID. Everything
is removed by exact name on ``close``, also after a failure.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
from dataclasses import dataclass, field
from ipaddress import IPv4Interface
from pathlib import Path

from pyroute2 import IPRoute

from podnet import netns
from podnet.deploy import parse_env
from podnet.testing.units import exec_start, load_unit

OVERLAID = ("/etc", "/var/lib", "/opt", "/usr/local")
RUN_DIR = Path("/run/podnet")
UNDERLAY = IPv4Interface("10.0.0.1/24")
BRIDGE = "br0"


@dataclass
class Host:
    """One hand-made host."""

    name: str
    address: IPv4Interface
    netns: str
    root: Path  # the host's upper layers, namespace files and logs
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def ip(self) -> str:
        return str(self.address.ip)

    @property
    def ns_dir(self) -> Path:
        return self.root / "ns"

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` wrapped to run in this host."""
        return [
            "nsenter",
            f"--net={netns.path(self.netns)}",
            f"--mount={self.ns_dir / 'mnt'}",
            f"--uts={self.ns_dir / 'uts'}",
            "--",
            *argv,
        ]

    def sh(
        self, script: str, env: dict[str, str] | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``script`` with bash (``set -euo pipefail``) in this host; raise with its
        output when it fails."""
        argv = self.command(["bash", "-c", "set -euo pipefail\n" + script])
        result = subprocess.run(
            argv,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise AssertionError(
                f"{self.name}: exit {result.returncode}:\n{script}\n"
                f"-- stdout:\n{result.stdout}\n-- stderr:\n{result.stderr}"
            )
        return result

    def start(self, label: str, argv: list[str], env: dict[str, str] | None = None) -> Path:
        """Start a daemon in this host (its own session, so it is stopped with whatever
        it started); return its log file."""
        if label in self.daemons and self.daemons[label].poll() is None:
            raise RuntimeError(f"{self.name}: {label} already runs")
        log = self.root / f"{label}.log"
        with open(log, "ab") as out:
            self.daemons[label] = subprocess.Popen(
                self.command(argv),
                env={**os.environ, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return log

    def stop(self, label: str, sig: signal.Signals = signal.SIGTERM, wait: float = 15.0) -> None:
        """Stop one daemon by its recorded PID (its session after ``wait``)."""
        process = self.daemons.pop(label, None)
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, sig)
        try:
            process.wait(wait)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def stop_all(self) -> None:
        for label in list(self.daemons):
            self.stop(label)

    def start_unit(self, name: str, bin_dir: str) -> None:
        """Start a unit installed in this host's /etc/systemd/system as systemd would:
        its ExecStart with this host's EnvironmentFiles and name for %H, as its User;
        ``/opt/podnet/bin`` (the guide's install) is ``bin_dir`` here."""
        unit = load_unit(self.root / "upper/etc/systemd/system" / name)
        env: dict[str, str] = {}
        for path in unit.values("Service", "EnvironmentFile"):
            env |= parse_env(self.sh(f"cat {path.lstrip('-')}").stdout)
        argv = exec_start(unit, env, hostname=self.name)
        argv[0] = argv[0].replace("/opt/podnet/bin/", f"{bin_dir}/")
        users = unit.values("Service", "User")
        if users:  # that user and its groups
            argv = ["setpriv", f"--reuid={users[0]}", f"--regid={users[0]}", "--init-groups", *argv]
        self.start(name, argv)

    def wait_until(self, check: str, seconds: float, what: str, env: dict[str, str]) -> None:
        """Run the shell test ``check`` in this host until it passes, for ``seconds`` at
        most; fail with what this host's daemons logged."""
        script = f"end=$((SECONDS + {int(seconds)})); until {check}; do "
        script += '[ "$SECONDS" -lt "$end" ] || exit 1; sleep 0.2; done'
        try:
            self.sh(script, env, timeout=seconds + 30)
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            logs = "\n".join(
                f"== {p.name}\n{p.read_text()[-3000:]}" for p in self.root.glob("*.log")
            )
            raise AssertionError(f"{self.name}: {what} not in {seconds:.0f} s\n{logs}") from exc


def _setup_script(host: Host) -> str:
    """What runs inside the new mount and UTS namespaces: the host name, the overlays
    (the machine's mounts below them moved back on top), and ``/run/podnet``."""
    lines = [f"hostname {shlex.quote(host.name)}"]
    mounts = _mount_points()
    for i, top in enumerate(OVERLAID):
        upper, work = host.root / "upper" / top.strip("/"), host.root / "work" / top.strip("/")
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        below = [m for m in mounts if m.startswith(top + "/")]
        stash = host.root / "stash" / str(i)
        for j, point in enumerate(below):  # keep what the machine mounted below
            kept = stash / str(j)
            kind = "-d" if os.path.isdir(point) else "-f"
            make = f"mkdir -p {kept}" if kind == "-d" else f"mkdir -p {stash} && touch {kept}"
            lines += [make, f"mount --rbind {shlex.quote(point)} {kept}"]
        options = f"lowerdir={top},upperdir={upper},workdir={work}"
        lines.append(f"mount -t overlay overlay -o {options} {top}")
        for j, point in enumerate(below):
            kept = stash / str(j)
            make = "mkdir -p" if os.path.isdir(point) else "touch"
            lines += [f"{make} {shlex.quote(point)}", f"mount --move {kept} {shlex.quote(point)}"]
    run = host.root / "run-podnet"
    run.mkdir(parents=True, exist_ok=True)
    lines.append(f"mount --bind {run} {RUN_DIR}")
    return "set -e\n" + "\n".join(lines) + "\n"


def _mount_points() -> list[str]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        found.append(point)
    return found


class Hosts:
    """Hosts on one underlay, under ``base``, named with ``prefix`` (unique per run)."""

    def __init__(self, prefix: str, base: Path) -> None:
        self.prefix = prefix
        self.base = base
        self.underlay = f"{prefix}-ul"
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _netns(self, name: str) -> str:
        netns.create(name)
        self._namespaces.append(name)
        return name

    def _underlay(self) -> None:
        if self.underlay in self._namespaces:
            return
        self._netns(self.underlay)
        with netns.entered(self.underlay):
            ipr = IPRoute()
        with ipr:
            ipr.link("add", ifname=BRIDGE, kind="bridge")
            index = ipr.link_lookup(ifname=BRIDGE)[0]
            ipr.link("set", index=index, state="up")
            ipr.addr(
                "add", index=index, address=str(UNDERLAY.ip), prefixlen=UNDERLAY.network.prefixlen
            )

    def add(self, name: str, last_octet: int) -> Host:
        """A new host ``name`` at 10.0.0.<last_octet>."""
        self._underlay()
        address = IPv4Interface(f"{UNDERLAY.network.network_address + last_octet}/24")
        host = Host(name, address, self._netns(f"{self.prefix}-{name}"), self.base / name)
        self.hosts[name] = host
        host.ns_dir.mkdir(parents=True)
        port = f"p-{name}"[:15]
        with netns.entered(self.underlay):
            ipr = IPRoute()
        with ipr:
            peer = {"ifname": "eth0", "net_ns_fd": str(netns.path(host.netns))}
            ipr.link("add", ifname=port, kind="veth", peer=peer)
            index = ipr.link_lookup(ifname=port)[0]
            bridge = ipr.link_lookup(ifname=BRIDGE)[0]
            ipr.link("set", index=index, master=bridge, state="up")
        with netns.entered(host.netns):
            ipr = IPRoute()
        with ipr:
            index = ipr.link_lookup(ifname="eth0")[0]
            ipr.link("set", index=index, state="up")
            ipr.addr("add", index=index, address=host.ip, prefixlen=24)
            ipr.route("add", dst="0.0.0.0/0", gateway=str(UNDERLAY.ip))
        self._mount_namespace(host)
        return host

    def _mount_namespace(self, host: Host) -> None:
        ns = host.ns_dir
        # A namespace file can be bound only on a private mount (no propagation loop).
        subprocess.run(["mount", "--bind", str(ns), str(ns)], check=True, timeout=30)
        subprocess.run(["mount", "--make-private", str(ns)], check=True, timeout=30)
        (ns / "mnt").touch()
        (ns / "uts").touch()
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        argv = ["unshare", f"--mount={ns / 'mnt'}", f"--uts={ns / 'uts'}", "--propagation"]
        argv += ["private", "--", "sh", "-c", _setup_script(host)]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"{host.name}: mount namespace: {result.stderr.strip()}")

    def close(self) -> None:
        """Stop every daemon, unbind the namespace files, remove the network namespaces
        (exact names)."""
        for host in self.hosts.values():
            host.stop_all()
        for host in self.hosts.values():
            for name in ("mnt", "uts"):
                subprocess.run(["umount", str(host.ns_dir / name)], capture_output=True, timeout=30)
            subprocess.run(["umount", str(host.ns_dir)], capture_output=True, timeout=30)
        for name in reversed(self._namespaces):
            netns.remove(name)
        self._namespaces.clear()
