"""The cluster DNS on a real local cluster: every node's agent serves its own pods, which
ask through their own resolv.conf (``/etc/netns``, bound over /etc in the pod sandbox)
with glibc's ``getent`` and with ``dig``. Names outside ``cluster.local`` go to the
node's upstream: a dnsmasq on the underlay's external host, which this test provides
(``cluster up --dns-upstream``; no configuration file, its pid file in the test's dir,
bound to the external host's address only, stopped by PID).

One 2-node cluster for the module, torn down in a finalizer even when a test fails.
Namespace ``dns`` holds the Services ``web`` (ClusterIP, named port http), ``hl``
(headless, two pods on two nodes), ``alias`` (ExternalName to ``web``, in the zone) and
``out`` (ExternalName to a name the upstream knows); namespace ``other`` holds ``db``.
The askers are ``ask1`` and ``ask2``, one per node.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network, ip_address
from pathlib import Path
from typing import Any

import pytest

from podnet import netns
from podnet.cluster import lifecycle, nodes, pods
from podnet.cluster.state import ClusterState
from podnet.cluster.underlay import DEFAULT_UNDERLAY, EXTERNAL_OFFSET
from podnet.model.kinds import SERVICE
from podnet.testing.cli import run_podnet
from podnet.testing.e2e import TEST_DATAPLANE, cluster_down_with_logs, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

NS, OTHER = "dns", "other"
DOMAIN = "cluster.local"
ZONE = f"svc.{DOMAIN}"
EXTERNAL_IP = str(IPv4Network(DEFAULT_UNDERLAY).network_address + EXTERNAL_OFFSET)
OUTSIDE = "www.outside.example"
OUTSIDE_IP = "198.51.100.7"
SETTLE = 30.0


@dataclass
class Cluster:
    state_dir: Path
    upstream_log: Path
    ips: dict[str, str]  # service name -> cluster IP

    def state(self) -> ClusterState:
        state = ClusterState.load(self.state_dir)
        assert state is not None
        return state

    def pod_ip(self, name: str, namespace: str = NS) -> str:
        return pods.find_pod(self.state(), name, namespace).ip

    def run(self, asker: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """``argv`` inside the pod ``asker`` (its sandbox: its resolv.conf, its user)."""
        return pods.exec_pod(self.state_dir, asker, list(argv), NS, timeout=60)

    def getent(self, asker: str, database: str, name: str) -> list[str]:
        """The addresses glibc finds for ``name`` ([] when it finds none)."""
        done = self.run(asker, "getent", database, name)
        return sorted({line.split()[0] for line in done.stdout.splitlines()})

    def dig(self, asker: str, *args: str) -> str:
        done = self.run(asker, "dig", "+tries=1", "+time=2", *args)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def short(self, asker: str, *args: str) -> list[str]:
        return sorted(self.dig(asker, "+short", *args).split("\n")[:-1])


def service(name: str, namespace: str, selector: dict[str, str] | None, **spec: Any) -> Any:
    ports = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"ports": ports, **({"selector": selector} if selector else {}), **spec},
    }


@contextlib.contextmanager
def upstream(tmp: Path) -> Iterator[Path]:
    """dnsmasq on the external host: knows ``OUTSIDE`` only, forwards nothing; its log."""
    state_dir = tmp / "state"
    pid_file, log = tmp / "dnsmasq.pid", tmp / "dnsmasq.log"
    external = ClusterState.load(state_dir)
    assert external is not None and external.external is not None
    argv = [
        "dnsmasq",
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        f"--pid-file={pid_file}",
        f"--listen-address={EXTERNAL_IP}",
        "--bind-interfaces",
        "--except-interface=lo",
        "--no-resolv",
        "--no-hosts",
        f"--host-record={OUTSIDE},{OUTSIDE_IP}",
        "--log-queries",
        f"--log-facility={log}",
    ]
    process = subprocess.Popen(netns.command(external.external.netns, argv))
    try:
        ask = ["dig", "+short", "+tries=1", "+time=1", f"@{EXTERNAL_IP}", OUTSIDE]

        def ready() -> bool:
            return netns.run(external.external.netns, ask).stdout.split() == [OUTSIDE_IP]

        wait_for(ready, 15, "dnsmasq answering on the external host")
        yield log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        process.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("pn-dns")
    state_dir = tmp / "state"
    try:
        spec = lifecycle.ClusterSpec(
            nodes=2, dns_upstreams=(EXTERNAL_IP,), dataplane=TEST_DATAPLANE
        )
        lifecycle.cluster_up(state_dir, spec, say=print)
        with upstream(tmp) as log:
            ips = {}
            with pods.admin_api(state_dir) as api:
                for namespace in (NS, OTHER):
                    pods.ensure_namespace(api, namespace)
                made = [
                    service("web", NS, {"app": "web"}),
                    service("hl", NS, {"app": "pet"}, clusterIP="None"),
                    service(
                        "alias", NS, None, type="ExternalName", externalName=f"web.{NS}.{ZONE}"
                    ),
                    service("out", NS, None, type="ExternalName", externalName=OUTSIDE),
                    service("db", OTHER, {"app": "db"}),
                ]
                for body in made:
                    created = api.create(SERVICE, body, namespace=body["metadata"]["namespace"])
                    ips[created["metadata"]["name"]] = created["spec"].get("clusterIP", "")
            pods.run_pod(state_dir, "web-0", NS, "node1", {"app": "web"})
            for k in (1, 2):
                pods.run_pod(state_dir, f"pet{k}", NS, f"node{k}", {"app": "pet"})
                pods.run_pod(state_dir, f"ask{k}", NS, f"node{k}", {"role": "asker"})
            yield Cluster(state_dir, log, ips)
    finally:
        cluster_down_with_logs(state_dir)


ASKERS = ("ask1", "ask2")


def test_a_records_and_search_names_with_glibc(cluster: Cluster) -> None:
    web = cluster.ips["web"]
    for asker in ASKERS:
        for name in ("web", f"web.{NS}", f"web.{NS}.svc", f"web.{NS}.{ZONE}"):
            found = wait_for(lambda n=name, a=asker: cluster.getent(a, "hosts", n), SETTLE, name)
            assert found == [web], (asker, name)
        # another namespace's Service by its short ``name.namespace``
        assert cluster.getent(asker, "hosts", f"db.{OTHER}") == [cluster.ips["db"]]
        assert cluster.getent(asker, "hosts", "db") == [], "a short name is this namespace's"
        assert cluster.getent(asker, "hosts", "no-such-service") == []


def test_records_with_dig(cluster: Cluster) -> None:
    web, fqdn = cluster.ips["web"], f"web.{NS}.{ZONE}"
    pets = sorted(cluster.pod_ip(f"pet{k}") for k in (1, 2))
    for asker in ASKERS:
        assert cluster.short(asker, fqdn) == [web]
        assert cluster.short(asker, f"_http._tcp.{fqdn}", "SRV") == [f"0 100 80 {fqdn}."]
        wait_for(lambda a=asker: cluster.short(a, f"hl.{NS}.{ZONE}") == pets, SETTLE, "hl")
        assert cluster.getent(asker, "ahostsv4", "hl") == pets, "headless: one per endpoint"
        assert cluster.short(asker, f"alias.{NS}.{ZONE}") == sorted([f"{fqdn}.", web])
        assert cluster.getent(asker, "hosts", "alias") == [web], "the CNAME chased by glibc"
        assert cluster.short(asker, "-x", web) == [f"{fqdn}."]
        assert cluster.short(asker, f"dns-version.{DOMAIN}", "TXT") == ['"1.1.0"']


def test_nxdomain_and_nodata_are_kept_apart(cluster: Cluster) -> None:
    for asker in ASKERS:
        missing = cluster.dig(asker, f"nosuch.{NS}.{ZONE}")
        assert "status: NXDOMAIN" in missing and "SOA" in missing, missing
        nodata = cluster.dig(asker, f"web.{NS}.{ZONE}", "AAAA")
        assert "status: NOERROR" in nodata and "ANSWER: 0" in nodata, nodata
        assert "SOA" in nodata, "a negative answer carries the SOA"


def test_names_outside_the_zone_go_to_the_external_hosts_resolver(cluster: Cluster) -> None:
    for k, asker in enumerate(ASKERS, start=1):
        assert cluster.short(asker, OUTSIDE) == [OUTSIDE_IP]
        assert cluster.getent(asker, "hosts", OUTSIDE) == [OUTSIDE_IP]
        node_ip = cluster.state().nodes[f"node{k}"].ip
        assert f"from {node_ip}" in cluster.upstream_log.read_text(), "asked by the node"
        # an ExternalName out of the zone: the CNAME, then the upstream's address
        assert cluster.getent(asker, "hosts", "out") == [OUTSIDE_IP]
    log = cluster.upstream_log.read_text()
    pod_ips = [cluster.pod_ip(a) for a in ASKERS]
    assert not any(f"from {ip}" in log for ip in pod_ips), "pods never ask upstream directly"


def test_a_new_service_is_answered_and_a_deleted_one_is_gone(cluster: Cluster) -> None:
    with pods.admin_api(cluster.state_dir) as api:
        ip = api.create(SERVICE, service("late", NS, {"app": "late"}), namespace=NS)
        late = ip["spec"]["clusterIP"]
        for asker in ASKERS:
            wait_for(lambda a=asker: cluster.getent(a, "hosts", "late") == [late], SETTLE, "late")
        api.delete(SERVICE, NS, "late")
        for asker in ASKERS:
            wait_for(lambda a=asker: cluster.getent(a, "hosts", "late") == [], SETTLE, "gone")
            nx = cluster.dig(asker, f"late.{NS}.{ZONE}")
            assert "status: NXDOMAIN" in nx, nx


def test_random_bytes_from_a_pod_do_not_stop_the_nodes_dns(cluster: Cluster) -> None:
    gateway = cluster.run("ask1", "sh", "-c", "grep nameserver /etc/resolv.conf").stdout.split()[1]
    assert ip_address(gateway)
    fuzz = (
        "import os, socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "for n in range(2000):\n"
        f"    s.sendto(os.urandom(n % 600), ({gateway!r}, 53))\n"
        "t = socket.create_connection((" + repr(gateway) + ", 53), 2)\n"
        "t.sendall(b'\\x00\\x10' + os.urandom(40)); t.close()\n"
    )
    done = cluster.run("ask1", sys.executable, "-c", fuzz)
    assert done.returncode == 0, done.stderr
    assert cluster.short("ask1", f"web.{NS}.{ZONE}") == [cluster.ips["web"]]
    agent = cluster.state().nodes["node1"].agent
    assert agent is not None and agent.alive()


def test_the_cluster_matrix_reaches_a_service_by_name_from_every_node(cluster: Cluster) -> None:
    admin = cluster.state_dir / "master" / "admin.kubeconfig"
    flags = ("-n", NS, "--state-dir", str(cluster.state_dir))
    done = run_podnet(admin, "cluster", "matrix", *flags, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if f"web.{NS}:80" in line]
    assert sorted(line.split()[1] for line in lines) == ["(node1)", "(node2)"], done.stdout
    assert all(f"-> ✓ {cluster.ips['web']}  tcp ✓" in line for line in lines), done.stdout
    assert "2/2 service lookups ok" in done.stdout


def test_a_pod_cannot_read_or_rewrite_its_nodes_upstream_resolvers(cluster: Cluster) -> None:
    path = nodes.node_paths(cluster.state_dir, "node1").upstream_resolv_conf
    before = path.read_text()
    assert before == f"nameserver {EXTERNAL_IP}\n"
    # Each attack must fail, and the pod must not even see the file (its sandbox hides
    # the cluster's state and has its own /tmp): so ``rm``, as ``rm -f`` of a path that
    # is not there succeeds.
    attacks = (f"test -e {path}", f"cat {path}", f"echo nameserver 6.6.6.6 > {path}", f"rm {path}")
    for attack in attacks:
        tried = cluster.run("ask1", "sh", "-c", attack)
        assert tried.returncode != 0 and "nameserver" not in tried.stdout, attack
        assert path.read_text() == before, attack
