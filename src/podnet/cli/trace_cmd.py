"""``podnet trace``: would this packet pass, and why; with ``--probe``, does it really.

The verdict comes from the rule set the data plane compiles (``podnet.policy``), built
from the API's objects. ``--probe`` then sends a real packet from the source pod of the
local cluster (``--state-dir``) and reports whether the data plane agrees; any
disagreement is a data plane bug, printed as ``DISAGREEMENT`` with exit code 3.
``--matrix`` does the same for every pair of the selected pods. ``--ofproto`` (a local
cluster on the ovs data plane) also traces each packet through the nodes' OpenFlow tables
(``trace_ofproto``), a second opinion, or a third one with ``--probe``. Errors (unknown pod, bad
address, bad option, an SCTP probe) are one line and exit code 1, before anything is
sent.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from ipaddress import IPv4Address
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from podnet.cli.cluster_cmd import STATE_DIR
from podnet.cli.main import CliError, CliState, pass_state
from podnet.cli.trace_ofproto import Ofproto, matrix_lines, pair_lines, service_lines, three_way
from podnet.cli.trace_service import probe_service, service_trace
from podnet.policy.evaluate import evaluate, reachability
from podnet.policy.explain import render_matrix, render_verdict
from podnet.policy.model import RuleSet
from podnet.policy.servicetrace import render_service_trace
from podnet.policy.trace import (
    ClusterObjects,
    Comparison,
    Target,
    TraceError,
    compare,
    fetch_objects,
    matrix_legend,
    packet_kind,
    probe_problem,
    render_probed_matrix,
    resolve,
    select_endpoints,
)

if TYPE_CHECKING:
    from podnet.cluster.matrix import Endpoint as ProbeSource

DISAGREEMENT_EXIT = 3
PROBE_WORKERS = 8
Pair = tuple[str, str]


@click.command("trace")
@click.argument("src", required=False)
@click.argument("dst", required=False)
@click.option("--port", type=click.IntRange(1, 65535), help="destination port")
@click.option(
    "--protocol",
    type=click.Choice(["tcp", "udp", "sctp", "icmp"], case_sensitive=False),
    help="default: tcp with --port, icmp (ping) without",
)
@click.option(
    "--probe",
    is_flag=True,
    help="also send real traffic from the source pod of the local cluster and compare "
    "(without --kubeconfig or $KUBECONFIG: that cluster's admin kubeconfig)",
)
@click.option("--matrix", "as_matrix", is_flag=True, help="every pair of the selected pods")
@click.option(
    "--ofproto",
    is_flag=True,
    help="also run OVS's ofproto/trace on the nodes of the local cluster (ovs data plane) "
    "and compare",
)
@click.option(
    "-n", "--namespace", "namespaces", multiple=True, help="with --matrix: only these namespaces"
)
@STATE_DIR
@pass_state
def trace(
    state: CliState,
    src: str | None,
    dst: str | None,
    port: int | None,
    protocol: str | None,
    probe: bool,
    as_matrix: bool,
    ofproto: bool,
    namespaces: tuple[str, ...],
    state_dir: Path,
) -> None:
    """Explain whether SRC may reach DST (pods as namespace/name, or IPv4 addresses;
    DST may be a Service, svc/NAMESPACE/NAME, or its cluster IP: then each endpoint).

    \b
    podnet trace frontend/web backend/db --port 5432
    podnet trace frontend/web svc/backend/db --port 5432 --probe
    podnet trace default/client 10.128.2.7 --port 53 --protocol udp --probe
    podnet trace --matrix -n frontend -n backend --port 8080 --probe
    podnet trace --matrix --port 8080 --ofproto --probe
    """
    _check_arguments(src, dst, as_matrix, namespaces)
    if probe or ofproto:
        _default_kubeconfig(state, state_dir)
    try:
        if ofproto:
            from podnet.cluster.ofprototrace import ovs_cluster  # OVS's libraries: only now

            ovs_cluster(state_dir)  # a cluster on another data plane: one line, first
        kind = _packet(protocol, port, probe)
        probing = state_dir if probe else None
        switches = state_dir if ofproto else None
        if as_matrix:
            code = _trace_matrix(state, kind, namespaces, probing, switches)
        else:
            assert src is not None and dst is not None
            code = _trace_pair(state, (src, dst), kind, probing, switches)
    except TraceError as exc:
        raise CliError(str(exc)) from exc
    click.get_current_context().exit(code)


def _check_arguments(
    src: str | None, dst: str | None, as_matrix: bool, namespaces: Sequence[str]
) -> None:
    if as_matrix and (src or dst):
        raise click.UsageError("--matrix takes no SRC or DST (select pods with -n)")
    if not as_matrix and namespaces:
        raise click.UsageError("-n/--namespace applies to --matrix only")
    if not as_matrix and not (src and dst):
        raise click.UsageError("trace needs SRC and DST (or --matrix)")


def _default_kubeconfig(state: CliState, state_dir: Path) -> None:
    """Probing is about the local cluster: talk to its master unless told otherwise."""
    admin = state_dir / "master" / "admin.kubeconfig"
    if state.kubeconfig is None and not os.environ.get("KUBECONFIG") and admin.exists():
        state.kubeconfig = str(admin)


def _packet(protocol: str | None, port: int | None, probe: bool) -> tuple[str, int | None]:
    kind = packet_kind(protocol, port)
    problem = probe_problem(*kind) if probe else None
    if problem:
        raise TraceError(problem)
    return kind


# --- one pair -----------------------------------------------------------------------------


def _trace_pair(
    state: CliState,
    ends: Pair,
    kind: tuple[str, int | None],
    state_dir: Path | None,
    switches: Path | None = None,
) -> int:
    """Print the verdict (and the probe's and OVS's lines); the exit code."""
    objects = fetch_objects(state.client())
    ovs = Ofproto.load(switches, objects.ruleset()) if switches is not None else None
    routed = service_trace(state.client(), objects, ends, kind)
    if routed is not None:
        target, route, verdicts = routed
        click.echo(render_service_trace(ends[0], route, verdicts))
        lines = []
        if ovs is not None:
            found = [ovs.check([(target.ip, b.ip, v.allowed)], (route.protocol, b.port))[0]
                     for b, v in verdicts]  # fmt: skip
            lines += service_lines([f"{b.ip}:{b.port}" for b, _ in verdicts], found)
        if state_dir is not None:
            lines += probe_service(_probe_source(state_dir, target), route, verdicts)
        if lines:
            click.echo("\n".join(lines))
        return DISAGREEMENT_EXIT if any("DISAGREEMENT" in line for line in lines) else 0
    src, dst = (resolve(end, objects.pods) for end in ends)
    source = _probe_source(state_dir, src) if state_dir is not None else None
    verdict = evaluate(objects.ruleset(), src.ip, dst.ip, *kind)
    click.echo(render_verdict(verdict))
    allowed = verdict.allowed
    firewall = _egress_firewall(objects, src, dst.ip)
    if firewall is not None:  # a destination outside the cluster
        click.echo("\n".join(firewall.lines))
        allowed = allowed and firewall.allowed
    agrees = True
    if ovs is not None:  # br0's flows hold the policy; the firewall is the host's
        check = ovs.check([(src.ip, dst.ip, verdict.allowed)], kind)[0]
        click.echo("\n".join(pair_lines(check)))
        agrees = check.agrees
    if source is not None:
        comparison = _probe(source, dst.ip, kind, allowed)
        click.echo(comparison.line())
        agrees = agrees and comparison.agrees
    return 0 if agrees else DISAGREEMENT_EXIT


def _egress_firewall(objects: ClusterObjects, src: Target, dst: IPv4Address) -> Any:
    """The egress firewall's word (``podnet.egress.explain``) when SRC is a pod."""
    from ipaddress import IPv4Network

    from podnet.egress.explain import firewall_verdict

    if src.pod is None:
        return None
    nets = [*objects.pod_networks, *([objects.service_network] if objects.service_network else [])]
    vnids = {
        str((n.get("metadata") or {}).get("name")): n["netid"]
        for n in objects.netnamespaces
        if isinstance(n.get("netid"), int)
    }
    namespace = src.pod.split("/", 1)[0]
    internal = [IPv4Network(n) for n in nets]
    return firewall_verdict(namespace, dst, internal, vnids, objects.egress_policies)


def _probe(
    source: ProbeSource, dst: IPv4Address, kind: tuple[str, int | None], allowed: bool
) -> Comparison:
    from podnet.cluster import matrix

    return compare(allowed, matrix.probe(source, str(dst), *kind))


def _probe_source(
    state_dir: Path, src: Target, sources: Mapping[str, ProbeSource] | None = None
) -> ProbeSource:
    """The local cluster's pod to probe from; TraceError when SRC is not one of them."""
    sources = _local_pods(state_dir) if sources is None else sources
    found = sources.get(src.pod) if src.pod else _by_ip(sources, src.ip)
    if found is None:
        raise TraceError(
            f"--probe: the source {src.pod or src.ip} is not a pod of the local cluster at "
            f"{state_dir}"
        )
    if found.ip != str(src.ip):
        raise TraceError(
            f"--probe: the API gives {found.name} the IP {src.ip} but the local cluster at "
            f"{state_dir} has {found.ip}: is the kubeconfig this cluster's?"
        )
    return found


def _local_pods(state_dir: Path) -> dict[str, ProbeSource]:
    """``namespace/name`` → probe endpoint, for every wired pod of the local cluster."""
    from podnet.cluster.matrix import Endpoint
    from podnet.cluster.state import ClusterState

    cluster = ClusterState.load(state_dir)
    if cluster is None or not cluster.cluster_id:
        raise TraceError(f"--probe needs the local cluster, and there is none at {state_dir}")
    return {
        key: Endpoint(key, pod.node, pod.ip, pod.netns)
        for key, pod in cluster.pods.items()
        if pod.ip
    }


def _by_ip(sources: Mapping[str, ProbeSource], ip: IPv4Address) -> ProbeSource | None:
    return next((s for s in sources.values() if s.ip == str(ip)), None)


# --- the matrix ---------------------------------------------------------------------------


def _trace_matrix(
    state: CliState,
    kind: tuple[str, int | None],
    namespaces: Sequence[str],
    state_dir: Path | None,
    switches: Path | None = None,
) -> int:
    """Print the grid (probed, with disagreements marked, when ``state_dir``), then OVS's
    verdicts (``switches``); the exit code."""
    ruleset = fetch_objects(state.client()).ruleset()
    ovs = Ofproto.load(switches, ruleset) if switches is not None else None
    endpoints = select_endpoints(ruleset, namespaces)
    names = [e.key for e in endpoints]
    allowed = reachability(ruleset, *kind, endpoints=endpoints)
    if state_dir is None:
        click.echo(render_matrix(names, allowed))
        click.echo(matrix_legend(ruleset, *kind))
        return _ofproto_matrix(ovs, ruleset, names, allowed, kind, None)
    probed = _probe_matrix(ruleset, names, allowed, kind, state_dir)
    click.echo(render_probed_matrix(names, allowed, probed))
    click.echo(matrix_legend(ruleset, *kind))
    agreed = {pair: c.agrees for pair, c in probed.items()}
    code = _ofproto_matrix(ovs, ruleset, names, allowed, kind, agreed)
    return code if all(agreed.values()) else DISAGREEMENT_EXIT


def _ofproto_matrix(
    ovs: Ofproto | None,
    ruleset: RuleSet,
    names: Sequence[str],
    allowed: Mapping[Pair, bool],
    kind: tuple[str, int | None],
    probed: Mapping[Pair, bool] | None,
) -> int:
    """OVS's verdict for every ordered pair of distinct pods (and the three-way summary
    with ``probed``); the exit code."""
    if ovs is None:
        return 0
    ips = {e.key: e.ip for e in ruleset.endpoints}
    pairs = [(s, d) for s in names for d in names if s != d]
    found = ovs.check([(ips[s], ips[d], allowed[(s, d)]) for s, d in pairs], kind)
    click.echo("\n".join(matrix_lines(pairs, found)))
    agrees = all(c.agrees for c in found)
    if probed is not None:
        lines, agrees = three_way(dict(zip(pairs, found, strict=True)), probed)
        click.echo("\n".join(lines))
    return 0 if agrees else DISAGREEMENT_EXIT


def _probe_matrix(
    ruleset: RuleSet,
    names: Sequence[str],
    allowed: Mapping[Pair, bool],
    kind: tuple[str, int | None],
    state_dir: Path,
) -> dict[Pair, Comparison]:
    """Probe every ordered pair of distinct pods, ``PROBE_WORKERS`` at a time."""
    ips = {e.key: e.ip for e in ruleset.endpoints}
    sources = _matrix_sources(state_dir, names, ips)
    pairs = [(s, d) for s in names for d in names if s != d]

    def run(pair: Pair) -> Comparison:
        return _probe(sources[pair[0]], ips[pair[1]], kind, allowed[pair])

    with ThreadPoolExecutor(max_workers=PROBE_WORKERS) as pool:
        return dict(zip(pairs, pool.map(run, pairs), strict=True))


def _matrix_sources(
    state_dir: Path, names: Sequence[str], ips: Mapping[str, IPv4Address]
) -> dict[str, ProbeSource]:
    """The local cluster's pod for each name; TraceError unless every one is there."""
    sources = _local_pods(state_dir)
    missing = [name for name in names if name not in sources]
    if missing:
        raise TraceError(
            f"--probe: {', '.join(missing)} are not pods of the local cluster at {state_dir} "
            "(select the cluster's pods with -n)"
        )
    return {name: _probe_source(state_dir, Target(ips[name], name), sources) for name in names}
