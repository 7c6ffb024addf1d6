"""One tenant's pod attacking another's processes and files on a real local cluster
(issue 19, finding 2): each pod has its own uid, PID namespace and private /tmp and
/dev/shm, so none of this works any more.

One 1-node multitenant cluster (etcd, master, agent, pods wired by the real CNI plugin),
torn down in a finalizer even when a test fails. ``attacker`` in project ``tenant-a``
and ``victim`` in ``tenant-b`` run the echo server on the same node. The attacker, given
host PIDs the test reads from the host (the victim's command and init, the node's exit
watcher and agent), tries ``kill``, ``PTRACE_ATTACH``, ``PTRACE_SEIZE``, ``pidfd_open``
with ``pidfd_getfd`` on each of its file descriptors (how the sockets were stolen), and
opening ``/proc/<pid>``: each must be refused with ESRCH or EPERM, and the victim must go
on serving. Files written in one pod's ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are seen
by that pod only. Deleting a pod leaves no process with its uid, not even one it left
running in the background. A volume (``pod run --volume``, through the CLI) shows its
directory to its pod only, with the host's modes; one that would show the cluster's
state or the host's ``/tmp`` is refused before any pod is made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from podnet import netns
from podnet.cluster import lifecycle, pods
from podnet.cluster.poduids import POD_UIDS, ids_in_use
from podnet.cluster.sandbox import process_ids
from podnet.cluster.state import ClusterState, PodRecord
from podnet.testing.e2e import TEST_DATAPLANE, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

PLACES = {"attacker": "tenant-a", "victim": "tenant-b"}
ECHO_PORT = 8080
# Run inside the attacker pod with host PIDs as arguments; prints, per PID and attack,
# "ok" when it worked or the errno's name when the kernel refused.
ATTACK = r"""
import ctypes, errno, json, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_SEIZE, PTRACE_DETACH = 16, 0x4206, 17
SYS_pidfd_getfd = 438

def tried(call):
    try:
        result = call()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "ok" if result is None or result >= 0 else errno.errorcode[ctypes.get_errno()]

def ptrace(request, pid):
    def call():
        done = libc.ptrace(request, pid, None, None)
        if done == 0:
            libc.ptrace(PTRACE_DETACH, pid, None, None)
        return done
    return tried(call)

def steal(pid):
    fd = os.pidfd_open(pid)
    stolen = [n for n in range(64) if libc.syscall(SYS_pidfd_getfd, fd, n, 0) >= 0]
    if not stolen:
        raise OSError(ctypes.get_errno(), "no fd stolen")

found = {}
for pid in map(int, sys.argv[1:]):
    found[pid] = {
        "ptrace_attach": ptrace(PTRACE_ATTACH, pid),
        "ptrace_seize": ptrace(PTRACE_SEIZE, pid),
        "pidfd_getfd": tried(lambda: steal(pid)),
        "proc": tried(lambda: os.close(os.open(f"/proc/{pid}", os.O_RDONLY))),
        "kill": tried(lambda: os.kill(pid, signal.SIGKILL)),
    }
print(json.dumps(found))
"""


@dataclass
class Cluster:
    state_dir: Path

    def pod(self, name: str) -> PodRecord:
        state = ClusterState.load(self.state_dir)
        assert state is not None
        return state.pods[f"{PLACES.get(name, 'tenant-a')}/{name}"]

    def node_pids(self) -> list[int]:
        state = ClusterState.load(self.state_dir)
        assert state is not None
        node = state.nodes["node1"]
        return [p.pid for p in (node.agent, node.podwatch) if p is not None and p.alive()]

    def exec(self, name: str, argv: list[str]) -> tuple[int, str, str]:
        done = pods.exec_pod(self.state_dir, name, argv, PLACES.get(name, "tenant-a"), timeout=60)
        return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("pn-tenants")
    try:
        spec = lifecycle.ClusterSpec(nodes=1, plugin="multitenant", dataplane=TEST_DATAPLANE)
        lifecycle.cluster_up(state_dir, spec, say=print)
        for name, namespace in PLACES.items():
            pods.run_pod(state_dir, name, namespace, "node1", {"role": name})
        yield Cluster(state_dir)
    finally:
        lifecycle.cluster_down(state_dir, say=print)


def serves(pod: PodRecord) -> bool:
    """Whether the pod's echo server answers TCP, asked from inside its own namespace."""
    targets = json.dumps([[pod.ip, "tcp", ECHO_PORT]])
    done = netns.run(pod.netns, [sys.executable, "-m", "podnet.testing.probe", targets])
    return done.returncode == 0 and json.loads(done.stdout) == [True]


def parent(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid:")))


def test_each_pod_runs_as_a_uid_of_its_own_without_capabilities(cluster: Cluster) -> None:
    ids: dict[str, tuple[int, int]] = {}
    for name in PLACES:
        process = cluster.pod(name).process
        assert process is not None and process.alive()
        found = process_ids(process.pid)
        assert found is not None
        ids[name] = found
        status = Path(f"/proc/{process.pid}/status").read_text().splitlines()
        caps = {ln.split(":")[0]: int(ln.split()[1], 16) for ln in status if ln.startswith("Cap")}
        none = dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapAmb"), 0)
        assert caps == {**none, "CapBnd": 1 << 10 | 1 << 13}, "net_bind_service, net_raw"
        assert "NoNewPrivs:\t1" in status
    assert ids["attacker"] != ids["victim"]
    assert all(uid in POD_UIDS and gid == uid for uid, gid in ids.values())
    code, out, _ = cluster.exec("attacker", ["id", "-u"])
    assert code == 0 and int(out) == ids["attacker"][0]


def test_a_pod_sees_only_its_own_processes(cluster: Cluster) -> None:
    victim = cluster.pod("victim").process
    assert victim is not None
    own = Path("/proc/self/ns/pid").stat().st_ino
    assert Path(f"/proc/{victim.pid}/ns/pid").stat().st_ino != own
    code, out, err = cluster.exec("attacker", ["ls", "/proc"])
    assert code == 0, err
    pids = sorted(int(name) for name in out.split() if name.isdigit())
    assert pids[0] == 1 and victim.pid not in pids and len(pids) < 10, pids


def test_a_pod_cannot_kill_trace_or_steal_from_another(cluster: Cluster) -> None:
    victim = cluster.pod("victim")
    assert victim.process is not None and serves(victim)
    targets = [victim.process.pid, parent(victim.process.pid), *cluster.node_pids()]
    code, out, err = cluster.exec("attacker", [sys.executable, "-c", ATTACK, *map(str, targets)])
    assert code == 0, err
    results = json.loads(out)
    worked = {(pid, how) for pid, tries in results.items() for how, r in tries.items() if r == "ok"}
    assert worked == set(), f"attacks that worked: {worked}"
    refusals = {r for tries in results.values() for r in tries.values()}
    assert refusals <= {"ESRCH", "EPERM", "ENOENT"}, refusals  # ENOENT: /proc/<pid> only
    assert victim.process.alive() and serves(victim), "the victim goes on serving"


@pytest.mark.parametrize("directory", ["/tmp", "/var/tmp", "/dev/shm"])
def test_shared_directories_are_private_to_each_pod(cluster: Cluster, directory: str) -> None:
    name = f"pn-secret-{os.getpid()}"
    code, _, err = cluster.exec("attacker", ["sh", "-c", f"echo s3cret > {directory}/{name}"])
    assert code == 0, err
    try:
        assert cluster.exec("attacker", ["cat", f"{directory}/{name}"])[1] == "s3cret\n"
        code, out, _ = cluster.exec("victim", ["cat", f"{directory}/{name}"])
        assert code != 0 and "s3cret" not in out, "another pod reads it"
        assert not (Path(directory) / name).exists(), "the host sees it"
    finally:
        cluster.exec("attacker", ["rm", "-f", f"{directory}/{name}"])


def test_deleting_a_pod_leaves_none_of_its_processes(cluster: Cluster) -> None:
    pod = pods.run_pod(cluster.state_dir, "leaver", "tenant-a", "node1", {"role": "leaver"})
    try:
        assert pod.process is not None
        ids = process_ids(pod.process.pid)
        assert ids is not None
        code, _, err = cluster.exec("leaver", ["sh", "-c", "sleep 600 > /dev/null 2>&1 &"])
        assert code == 0, err
        assert ids[0] in ids_in_use(), "the pod and its background sleep run"
    finally:
        pods.delete_pod(cluster.state_dir, "leaver", "tenant-a")
    assert ids[0] not in ids_in_use(), "a process of the deleted pod is left"
    wait_for(lambda: not Path(f"/proc/{pod.process.pid}").exists(), 10, "the pod's PID gone")


def podnet_pod(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``podnet pod ARGS`` on the cluster, in project tenant-a."""
    flags = ["--state-dir", str(cluster.state_dir), "-n", "tenant-a"]
    argv = [sys.executable, "-m", "podnet", "pod", args[0], *flags, *args[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_a_volume_shows_its_directory_to_its_pod_only(cluster: Cluster, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "drop").mkdir(parents=True)
    (shared / "notes").write_text("hello\n")
    (shared / "secret").write_text("s3cret\n")
    (shared / "secret").chmod(0o600)
    (shared / "drop").chmod(0o1777)
    made = podnet_pod(cluster, "run", "--node", "node1", "--volume", f"{shared}:/mnt", "holder")
    assert made.returncode == 0, made.stderr
    try:
        read = podnet_pod(cluster, "exec", "holder", "--", "cat", "/mnt/notes")
        assert read.returncode == 0 and read.stdout == "hello\n", read.stderr
        code, out, _ = cluster.exec("holder", ["cat", "/mnt/secret"])
        assert code != 0 and "s3cret" not in out, "the host's modes hold in the volume"
        code, _, err = cluster.exec("holder", ["sh", "-c", "echo mine > /mnt/drop/file"])
        assert code == 0, err
        process = cluster.pod("holder").process
        assert process is not None and (ids := process_ids(process.pid)) is not None
        assert (shared / "drop" / "file").stat().st_uid == ids[0] != 0, "written as its uid"
        code, out, _ = cluster.exec("victim", ["cat", "/mnt/notes"])
        assert code != 0 and "hello" not in out, "another pod sees the volume"
    finally:
        podnet_pod(cluster, "delete", "holder")


def test_a_volume_of_the_state_or_the_hosts_tmp_is_refused(cluster: Cluster) -> None:
    state_dir = cluster.state_dir
    for source in (state_dir, state_dir / "pods", Path("/tmp")):
        refused = podnet_pod(cluster, "run", "--volume", f"{source}:/mnt", "peeker")
        assert refused.returncode == 1, refused.stdout
        assert "--volume" in refused.stderr and "would" in refused.stderr, refused.stderr
        state = ClusterState.load(state_dir)
        assert state is not None and "tenant-a/peeker" not in state.pods, "no pod is made"
