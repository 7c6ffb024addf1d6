"""The cluster DNS settings of a pod (pure, stdlib only): what the CNI result's ``dns``
carries and what a pod's ``resolv.conf`` says.

A pod asks its node's DNS server (the node's pod-subnet gateway address) and searches its
own namespace's services first, as a kubelet's ``ClusterFirst`` policy sets it up:
``search <ns>.svc.cluster.local svc.cluster.local cluster.local`` and ``options ndots:5``.
"""

from __future__ import annotations

import ipaddress
import re

from podnet.cni.result import DNS

CLUSTER_DOMAIN = "cluster.local"
NDOTS = 5
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class DnsConfigError(ValueError):
    """A DNS setting that cannot go into a resolv.conf (the message says which)."""


def search_domains(namespace: str | None, domain: str = CLUSTER_DOMAIN) -> tuple[str, ...]:
    """The search list: the namespace's services first, when ``namespace`` is known and a
    DNS label (anything else, e.g. a CNI_ARGS value no Kubernetes namespace can have, is
    left out rather than written into a resolver's configuration)."""
    own = (f"{namespace}.svc.{domain}",) if namespace and _LABEL.fullmatch(namespace) else ()
    return (*own, f"svc.{domain}", domain)


def cluster_dns(nameserver: str, namespace: str | None, domain: str = CLUSTER_DOMAIN) -> DNS:
    """The DNS settings of a pod in ``namespace`` whose node serves DNS on ``nameserver``
    (an IP address; ValueError otherwise)."""
    address = str(ipaddress.ip_address(nameserver))
    return DNS(
        nameservers=(address,),
        search=search_domains(namespace, domain),
        options=(f"ndots:{NDOTS}",),
    )


def _checked_word(kind: str, word: str) -> str:
    if not word or any(c.isspace() for c in word) or not word.isprintable():
        raise DnsConfigError(f"{kind} {word!r} cannot go into a resolv.conf")
    return word


def resolv_conf(dns: DNS) -> str:
    """``dns`` as resolv.conf text; DnsConfigError for a value that would break a line
    (whitespace, control characters) or a nameserver that is not an IP address."""
    if not dns.nameservers:
        raise DnsConfigError("no nameserver")
    lines = []
    for server in dns.nameservers:
        try:
            lines.append(f"nameserver {ipaddress.ip_address(server)}")
        except ValueError as exc:
            raise DnsConfigError(f"nameserver {server!r} is not an IP address") from exc
    if dns.domain:
        lines.append(f"domain {_checked_word('domain', dns.domain)}")
    if dns.search:
        lines.append("search " + " ".join(_checked_word("search domain", d) for d in dns.search))
    if dns.options:
        lines.append("options " + " ".join(_checked_word("option", o) for o in dns.options))
    return "\n".join(lines) + "\n"
