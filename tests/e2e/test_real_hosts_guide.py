"""``docs/real-hosts.md``, run as written on three hand-made hosts (``podnet.testing.hosts``).

Every block the page marks ``<!-- test: NAME -->`` runs, in the page's order, in the host
the page says, with only the values the page tells the reader to carry from one host to
the next (the CA hash, the tokens, the certificate key, the peer's address). podnet is
installed from the wheel into each host's ``/opt/podnet`` by the page's own commands, and
the units ``adm init`` and ``adm join`` install are started by their ``ExecStart`` lines
(``Host.start_unit``: systemd does not run these hosts), as their users.

Between the page's steps the test does what the page says the operator does (start the
units, stop a node's units, copy the snapshot) and what the page promises: the nodes go
Ready, pods on different hosts talk, and the leader master SIGKILLed under 20 pings a
second loses no ping and leaves both nodes Ready; a removed node is gone; a restore
brings back the cluster as it was at the backup.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from podnet.testing import docsteps
from podnet.testing.hosts import Host, Hosts
from podnet.testing.podman import IMAGE, rootfs_tarball

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = docsteps.DOCS / "real-hosts.md"
RUNTIMES = docsteps.DOCS / "runtimes.md"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a host's own
BIN = "/opt/podnet/bin"  # what the install step made
ADMIN = "/var/lib/podnet/master/admin.kubeconfig"
PODMAN_ROOT = "/var/lib/podnet-podman"
PODMAN = {  # what runtimes.md has the reader set and export, on a real host
    "NODE_NETNS": "",
    "CNI_BIN_DIR": "/opt/cni/bin",
    "CNI_CONF_DIR": "/etc/cni/net.d",
    "PODMAN_ROOT": PODMAN_ROOT,
    "IMAGE": IMAGE,
    "CONTAINERS_CONF": f"{PODMAN_ROOT}/containers.conf",
    "CONTAINERS_STORAGE_CONF": f"{PODMAN_ROOT}/storage.conf",
    "XDG_RUNTIME_DIR": f"{PODMAN_ROOT}/xdg",
    "TMPDIR": f"{PODMAN_ROOT}/tmp",
}
KEY = re.compile(r"^[0-9a-f]{64}$", re.M)
TOKEN = re.compile(r"^[a-z0-9]{6}\.[a-z0-9]{16}$", re.M)
PINGS = 200  # 10 s at 20 a second
READY = (  # reads a NodeList as JSON on stdin: prints the Ready nodes
    "import json,sys; print(' '.join(sorted(n['metadata']['name'] for n in "
    "json.load(sys.stdin)['items'] if any(c['type']=='Ready' and c['status']=='True' "
    "for c in n['status'].get('conditions') or []))))"
)


def step(host: Host, name: str, values: dict[str, str] | None = None, cwd: str = "/") -> str:
    """The page's blocks ``name``, run in ``host`` (bash, ``set -euo pipefail``) from
    ``cwd``, with the values the page says the reader carries."""
    script = f"cd {cwd}\n" + "".join(docsteps.steps(GUIDE, name))
    return host.sh(script, {"PATH": PATH, **(values or {})}, timeout=180).stdout


def start_units(host: Host, *units: str) -> None:
    for unit in units:
        host.start_unit(unit, BIN)


def ready(host: Host, what: str, seconds: float = 90) -> None:
    check = f"curl -skf https://{host.ip}:6443/readyz >/dev/null"
    host.wait_until(check, seconds, what, {"PATH": PATH})


def kubectl(host: Host, args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = host.command(["kubectl", "--kubeconfig", ADMIN, *args.split()])
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {args} on {host.name}: {result.stderr}")
    return result


def ready_nodes(host: Host) -> set[str]:
    found = kubectl(host, "get nodes -o json", check=False)
    if found.returncode != 0:
        return set()
    done = subprocess.run(
        [sys.executable, "-c", READY], input=found.stdout, capture_output=True, text=True
    )
    return set(done.stdout.split())


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    """The wheel the page installs, built as it says (``pip wheel --no-deps``)."""
    source = tmp_path / "source"  # a copy: a build writes build/ beside its source
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    out = tmp_path / "wheel"
    argv = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)]
    subprocess.run(argv, check=True, capture_output=True, timeout=300)
    # The hosts have no way out to a package index: a wheelhouse of podnet's
    # dependencies stands in for it (PIP_FIND_LINKS, PIP_NO_INDEX), as a mirror would.
    (built,) = out.glob("podnet-*.whl")
    argv = [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(tmp_path / "index"), str(built)]
    subprocess.run(argv, check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[dict[str, Host]]:
    with Hosts(f"pg{uuid.uuid4().hex[:6]}", tmp_path / "hosts") as made:
        lab = {"m1": made.add("m1", 21), "m2": made.add("m2", 22), "n1": made.add("n1", 31)}
        try:
            yield lab
        finally:
            for host in (lab["m2"], lab["n1"]):  # podman's containers, by their names
                host.sh(
                    f"podman rm -f -t 0 pinger-{host.name} >/dev/null 2>&1 || true",
                    {"PATH": PATH, **PODMAN},
                )


def prepare_podman(host: Host, tarball: Path) -> None:
    """runtimes.md's podman configuration for a real host, and a local image."""
    variables = {"PATH": PATH, **PODMAN}
    host.sh("".join(docsteps.steps(RUNTIMES, "podman-config")), variables)
    host.sh(f"podman import --change 'CMD [\"/bin/sh\"]' {tarball} {IMAGE} >/dev/null", variables)


def test_the_real_host_guide_as_written(
    hosts: dict[str, Host], wheel: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    m1, m2, n1 = hosts["m1"], hosts["m2"], hosts["n1"]
    with ThreadPoolExecutor(3) as pool:  # 1. install, on every host at once
        index = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheel.parent / "index")}
        list(pool.map(lambda h: step(h, "install", index, cwd=str(wheel)), hosts.values()))
    print(f"installed: {time.monotonic() - started:.0f} s")

    out = step(m1, "init")  # 2. the first master
    ca_hash = re.search(r"CA hash: (sha256:[0-9a-f]{64})", out)
    assert ca_hash is not None, out
    start_units(m1, "podnet-etcd.service", "podnet-master.service")
    ready(m1, "m1's master ready")
    out = step(m1, "credentials", {"KUBECONFIG": ADMIN})
    (cert_key,) = KEY.findall(out)
    token, n1_token = TOKEN.findall(out)
    carried = {"CA_HASH": ca_hash.group(1), "CERT_KEY": cert_key}

    step(m2, "join-master", {"TOKEN": token, **carried})  # 3. a second master
    modes = m2.sh("cd /etc/podnet/etcd-pki && stat -c %U:%a ca.key member-m2.key").stdout
    assert modes.split() == ["root:600", "etcd:600"]  # the CA's key stays root's
    start_units(m2, "podnet-etcd.service", "podnet-master.service")
    ready(m2, "m2's master ready")
    ready(m1, "m1's master ready with two etcd members")

    step(m2, "join-node", {"TOKEN": token, **carried})  # 4. nodes
    step(n1, "join-node", {"TOKEN": n1_token, **carried})
    for host in (m2, n1):
        start_units(host, "podnet-api-relay.service", "podnet-node.service")
    step(m1, "nodes-ready", {"KUBECONFIG": ADMIN})
    print(f"nodes ready: {time.monotonic() - started:.0f} s")

    tarball = rootfs_tarball(tmp_path)  # 5. pods across hosts
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda h: prepare_podman(h, tarball), (m2, n1)))
    addresses = {h.name: step(h, "pod", PODMAN).strip().splitlines()[-1] for h in (m2, n1)}
    assert addresses["m2"] != addresses["n1"], addresses
    out = step(m2, "ping", {"PEER": addresses["n1"], **PODMAN})
    assert "3 packets received" in out, out

    survivor = fail_over_under_pings(hosts, addresses["n1"])
    print(f"failover done: {time.monotonic() - started:.0f} s")
    dead = m1 if survivor is m2 else m2
    start_units(dead, "podnet-master.service")  # as systemd's Restart=always would
    ready(dead, f"{dead.name}'s master back")

    n1.stop("podnet-node.service")  # 6. remove n1: its units first, then the node
    n1.stop("podnet-api-relay.service")
    out = step(m1, "remove-node", {"KUBECONFIG": ADMIN})
    assert "n1" in out, out
    assert "NotFound" in kubectl(m1, "get node n1", check=False).stderr

    step(m1, "backup", {"KUBECONFIG": ADMIN})  # 7. backup and restore
    kubectl(m1, "create namespace after-backup")
    copy(m1, m2, "/var/lib/podnet/etcd-backup.db")  # the operator's scp
    for host in (m1, m2):
        host.stop("podnet-master.service")
        host.stop("podnet-etcd.service")
    step(m1, "restore", {"NAME": "m1", "IP": m1.ip})
    step(m2, "restore", {"NAME": "m2", "IP": m2.ip})
    for host in (m1, m2):
        start_units(host, "podnet-etcd.service")
    pki = "/etc/podnet/etcd-pki"
    health = (
        f"curl -sf --cacert {pki}/ca.crt --cert {pki}/client-podnet-master.crt "
        f"--key {pki}/client-podnet-master.key https://{m1.ip}:2379/health | grep -q true"
    )
    m1.wait_until(health, 60, "etcd restored and healthy", {"PATH": PATH})
    for host in (m1, m2):
        start_units(host, "podnet-master.service")
    ready(m1, "m1's master after the restore")
    assert "NotFound" in kubectl(m1, "get namespace after-backup", check=False).stderr
    assert "NotFound" in kubectl(m1, "get node n1", check=False).stderr  # removed before
    kubectl(m1, "get node m2")
    elapsed = time.monotonic() - started
    print(f"the guide, end to end: {elapsed:.0f} s (goal < 180 s)")


def copy(source: Host, target: Host, path: str) -> None:
    """``path`` from one host to the other, through a pipe (a snapshot is megabytes)."""
    with subprocess.Popen(source.command(["cat", path]), stdout=subprocess.PIPE) as reader:
        subprocess.run(
            target.command(["sh", "-c", f"cat > {path}"]), stdin=reader.stdout, check=True,
            timeout=60,
        )  # fmt: skip
    assert reader.returncode == 0, f"reading {path} on {source.name} failed"


def leader(hosts: dict[str, Host]) -> Host:
    found = leader_or_none(hosts)
    if found is None:
        raise AssertionError("no master says it leads")
    return found


def leader_or_none(hosts: dict[str, Host]) -> Host | None:
    for host in (hosts["m1"], hosts["m2"]):
        probe = f"curl -sk -o /dev/null -w '%{{http_code}}' https://{host.ip}:6443/leaderz || :"
        if host.sh(probe, {"PATH": PATH}).stdout == "200":
            return host
    return None


def fail_over_under_pings(hosts: dict[str, Host], peer: str) -> Host:
    """SIGKILL the leader master while m2's container pings n1's 20 times a second: no
    ping lost, both nodes Ready on the survivor all along. Returns the survivor."""
    m2 = hosts["m2"]
    pid = m2.sh("podman inspect -f '{{.State.Pid}}' pinger-m2", {"PATH": PATH, **PODMAN})
    ping = f"nsenter --net=/proc/{pid.stdout.strip()}/ns/net ping -q -i 0.05 -c {PINGS}"
    result: list[str] = []
    pinger = threading.Thread(
        target=lambda: result.append(m2.sh(f"{ping} -W 1 {peer} || true", timeout=60).stdout)
    )
    doomed = leader(hosts)
    survivor = hosts["m2"] if doomed is hosts["m1"] else hosts["m1"]
    pinger.start()
    time.sleep(2)
    doomed.stop("podnet-master.service", signal.SIGKILL)
    seen: list[set[str]] = []
    while pinger.is_alive():
        seen.append(ready_nodes(survivor))
        time.sleep(0.5)
    pinger.join()
    assert result and f"{PINGS} packets transmitted, {PINGS} received" in result[0], result
    assert seen and all(found == {"m2", "n1"} for found in seen), seen
    assert ready_nodes(survivor) == {"m2", "n1"}
    deadline = time.monotonic() + 60  # the dead leader's etcd lease runs out first
    while leader_or_none(hosts) is not survivor and time.monotonic() < deadline:
        time.sleep(0.5)
    assert leader_or_none(hosts) is survivor
    return survivor
