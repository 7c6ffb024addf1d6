"""A pod's DNS settings: the CNI result's ``dns``, resolv.conf rendering, the
/etc/netns/<name> files (in a temporary root) and the sandbox's --etc binding."""

from __future__ import annotations

from pathlib import Path

import pytest

from podnet.agent.pods import cni_result
from podnet.cluster import podcni
from podnet.cluster.podresolv import (
    PodResolvError,
    netns_etc_dir,
    remove_resolv_conf,
    write_resolv_conf,
)
from podnet.cluster.sandbox import Sandbox
from podnet.cni.dnsconfig import DnsConfigError, cluster_dns, resolv_conf, search_domains
from podnet.cni.result import DNS, format_result, parse_result


def test_cluster_dns_and_its_resolv_conf() -> None:
    dns = cluster_dns("10.128.0.1", "shop")
    assert dns.nameservers == ("10.128.0.1",)
    assert dns.search == ("shop.svc.cluster.local", "svc.cluster.local", "cluster.local")
    assert dns.options == ("ndots:5",)
    assert resolv_conf(dns) == (
        "nameserver 10.128.0.1\n"
        "search shop.svc.cluster.local svc.cluster.local cluster.local\n"
        "options ndots:5\n"
    )


@pytest.mark.parametrize("namespace", [None, "", "Shop", "a b", "x\n", "a" * 64, "-a"])
def test_a_namespace_that_is_no_dns_label_is_left_out(namespace: str | None) -> None:
    assert search_domains(namespace) == ("svc.cluster.local", "cluster.local")


def test_cluster_dns_needs_an_ip() -> None:
    with pytest.raises(ValueError):
        cluster_dns("node1", "shop")


@pytest.mark.parametrize(
    ("dns", "words"),
    [
        (DNS(), "no nameserver"),
        (DNS(nameservers=("dns.example",)), "not an IP address"),
        (DNS(nameservers=("10.0.0.1",), search=("a b",)), "search domain"),
        (DNS(nameservers=("10.0.0.1",), search=("a\nnameserver 6.6.6.6",)), "search domain"),
        (DNS(nameservers=("10.0.0.1",), options=("ndots:5\n",)), "option"),
        (DNS(nameservers=("10.0.0.1",), domain="x\ty"), "domain"),
    ],
)
def test_resolv_conf_refuses_what_would_break_a_line(dns: DNS, words: str) -> None:
    with pytest.raises(DnsConfigError, match=words):
        resolv_conf(dns)


def test_resolv_conf_keeps_a_domain_line() -> None:
    text = resolv_conf(DNS(nameservers=("10.0.0.1",), domain="example.org"))
    assert text == "nameserver 10.0.0.1\ndomain example.org\n"


def _result(dns: DNS | None) -> dict[str, object]:
    from ipaddress import IPv4Address, IPv4Interface

    from podnet.dataplane.interface import PodAttachment

    attachment = PodAttachment(
        container_id="c",
        ifname="eth0",
        address=IPv4Interface("10.128.2.7/23"),
        gateway=IPv4Address("10.128.2.1"),
        host_ifname="vethx",
        mac="0a:58:0a:80:02:07",
        mtu=1450,
        sandbox="/run/netns/x",
    )
    return format_result(cni_result(attachment, [], dns), "1.1.0")


def test_the_add_result_carries_dns_and_the_runtime_reads_it() -> None:
    formatted = _result(cluster_dns("10.128.2.1", "shop"))
    assert formatted["dns"] == {
        "nameservers": ["10.128.2.1"],
        "search": ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local"],
        "options": ["ndots:5"],
    }
    assert parse_result(formatted).dns == cluster_dns("10.128.2.1", "shop")
    assert podcni.result_dns(formatted, "other") == cluster_dns("10.128.2.1", "shop")
    # an agent without dns in its result: the gateway, the runtime's namespace
    assert podcni.result_dns(_result(None), "web") == cluster_dns("10.128.2.1", "web")
    with pytest.raises(podcni.PodError, match="neither"):
        podcni.result_dns({"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.2/24"}]}, "a")
    with pytest.raises(podcni.PodError, match="malformed"):
        podcni.result_dns({"ips": [{"address": "nonsense"}]}, "a")


def test_resolv_conf_file_created_and_removed_by_exact_name(tmp_path: Path) -> None:
    root = tmp_path / "netns"
    path = write_resolv_conf("pn-x-p-1", "nameserver 10.0.0.1\n", root)
    assert path == root / "pn-x-p-1" / "resolv.conf"
    assert path.read_text() == "nameserver 10.0.0.1\n"
    assert path.stat().st_mode & 0o777 == 0o644
    neighbour = write_resolv_conf("pn-x-p-2", "nameserver 10.0.0.2\n", root)
    assert remove_resolv_conf("pn-x-p-1", root) is True
    assert not (root / "pn-x-p-1").exists() and neighbour.exists() and root.is_dir()
    assert remove_resolv_conf("pn-x-p-1", root) is False, "idempotent"
    # a directory holding something else (not ours) keeps it, and stays
    other = root / "pn-x-p-2" / "hosts"
    other.write_text("keep")
    assert remove_resolv_conf("pn-x-p-2", root) is True
    assert other.read_text() == "keep" and not neighbour.exists()


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../etc", "x\0"])
def test_netns_names_that_are_not_one_path_part_are_refused(name: str, tmp_path: Path) -> None:
    with pytest.raises(PodResolvError):
        netns_etc_dir(name, tmp_path)
    with pytest.raises(PodResolvError):
        write_resolv_conf(name, "nameserver 10.0.0.1\n", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_sandbox_binds_the_etc_directory_only_when_given() -> None:
    plain = Sandbox((Path("/srv"),)).wrap("/run/netns/x", ["true"])
    assert "--etc" not in plain
    bound = Sandbox((Path("/srv"),), etc=Path("/etc/netns/x")).wrap("/run/netns/x", ["true"])
    at = bound.index("--etc")
    assert bound[at + 1] == "/etc/netns/x" and at < bound.index("--", at)
