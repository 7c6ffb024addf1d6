"""``podnet pod run|exec|delete``: pods of the local cluster, wired by the real CNI plugin.

A pod here is a network namespace with one process (by default a TCP+UDP echo server on
port 8080, or on each ``--port``), registered as a Pod object on its node, as a kubelet
would. Its processes run as a uid of the pod's own, without capabilities, in the pod's
own mount, PID and IPC namespaces, where podnet's state directories are hidden and
``/tmp`` and ``/dev/shm`` are private; ``--privileged`` runs them as root. ``pod exec``
joins the running pod's namespaces, as its user. They resolve names through
the cluster DNS and get their namespace's service variables. ``--ready-tcp`` or
``--ready-cmd`` gives the pod a readiness check, which its prober runs every
``--ready-period`` seconds; without one the pod is Ready once its process runs.
``--volume HOST_DIR:POD_DIR`` shows a host directory in the pod, read-write, as a
``hostPath`` volume does; one that would show podnet's state, the host's ``/tmp`` (or
another directory each pod has private) or cover what the sandbox mounts is refused
(``podnet.cluster.podvolumes``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import click

from podnet.cli.cluster_cmd import STATE_DIR
from podnet.cluster.pods import ECHO_COMMAND, ContainerPort, PodError, check_ports
from podnet.cluster.podvolumes import Volume, check_volumes, parse_volume
from podnet.cluster.readiness import ReadinessCheck, ReadinessError

NAMESPACE = click.option("-n", "--namespace", default="default", show_default=True)


def _labels(values: tuple[str, ...]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r}: expected key=value", param_hint="--label")
        labels[key] = val
    return labels


def parse_port(value: str) -> ContainerPort:
    """``[NAME=]PORT[/PROTO]`` as (name or None, port, protocol); BadParameter if malformed."""
    name, sep, rest = value.rpartition("=")
    number, slash, protocol = rest.partition("/")
    if (sep and not name) or (slash and not protocol) or not number.strip().isdigit():
        raise click.BadParameter(f"{value!r}: expected [NAME=]PORT[/PROTO]", param_hint="--port")
    try:
        return check_ports([(name or None, int(number), protocol or "TCP")])[0]
    except PodError as exc:
        raise click.BadParameter(f"{value!r}: {exc}", param_hint="--port") from exc


def readiness_check(
    tcp: int | None, command: str | None, period: float, failures: int
) -> ReadinessCheck | None:
    """The check the options ask for (None without one); UsageError if malformed."""
    if tcp is None and command is None:
        return None
    if tcp is not None and command is not None:
        raise click.UsageError("give --ready-tcp or --ready-cmd, not both")
    try:
        timeout = min(1.0, period)
        return ReadinessCheck(tcp, command, period, timeout, failures=failures)
    except ReadinessError as exc:
        raise click.UsageError(f"readiness check: {exc}") from exc


def _ports(values: tuple[str, ...]) -> list[ContainerPort]:
    try:
        return check_ports([parse_port(value) for value in values])
    except PodError as exc:
        raise click.BadParameter(str(exc), param_hint="--port") from exc


def _volumes(values: tuple[str, ...], state_dir: Path) -> list[Volume]:
    """Each ``HOST_DIR:POD_DIR`` as a checked volume; BadParameter naming it if not."""
    try:
        return list(check_volumes([parse_volume(value) for value in values], state_dir))
    except PodError as exc:
        raise click.BadParameter(str(exc), param_hint="--volume") from exc


@click.group("pod")
def pod() -> None:
    """Run, enter and delete pods of the local cluster."""


@pod.command("run", context_settings={"ignore_unknown_options": True})
@STATE_DIR
@NAMESPACE
@click.option("--node", help="node to run on (default: the one with the fewest pods)")
@click.option("--label", "-l", "labels", multiple=True, metavar="KEY=VALUE")
@click.option(
    "--port",
    "-p",
    "ports",
    multiple=True,
    metavar="[NAME=]PORT[/PROTO]",
    help="a container port (repeatable; PROTO tcp, udp or sctp, default tcp); "
    "the echo server serves each TCP/UDP one",
)
@click.option(
    "--privileged",
    is_flag=True,
    help="run as root (default: a uid of the pod's own); podnet's directories stay hidden, "
    "but root can undo that: not a security boundary",
)
@click.option(
    "--volume",
    "volumes",
    multiple=True,
    metavar="HOST_DIR:POD_DIR",
    help="show host directory HOST_DIR at POD_DIR in the pod, read-write (repeatable); "
    "POD_DIR must exist; one holding podnet's state or the host's /tmp is refused",
)
@click.option("--ready-tcp", type=int, metavar="PORT", help="ready while PORT accepts TCP")
@click.option("--ready-cmd", metavar="CMD", help="ready while `sh -c CMD` exits 0 (run in the pod)")
@click.option(
    "--ready-period",
    type=float,
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="how often the readiness check runs",
)
@click.option(
    "--ready-failures",
    type=int,
    default=3,
    show_default=True,
    metavar="N",
    help="failed checks in a row that make a ready pod not ready",
)
@click.argument("name")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(
    state_dir: Path,
    namespace: str,
    node: str | None,
    labels: tuple[str, ...],
    ports: tuple[str, ...],
    privileged: bool,
    volumes: tuple[str, ...],
    ready_tcp: int | None,
    ready_cmd: str | None,
    ready_period: float,
    ready_failures: int,
    name: str,
    command: tuple[str, ...],
) -> None:
    """Create pod NAME and start COMMAND in it (after `--`; default: the echo server)."""
    from podnet.cluster.pods import run_pod

    check = readiness_check(ready_tcp, ready_cmd, ready_period, ready_failures)
    container_ports = _ports(ports)
    pod_labels = _labels(labels)
    pod_volumes = _volumes(volumes, state_dir)
    try:
        record = run_pod(
            state_dir,
            name,
            namespace,
            node,
            pod_labels,
            command or ECHO_COMMAND,
            container_ports,
            privileged=privileged,
            readiness=check,
            volumes=pod_volumes,
        )
    except PodError as exc:
        raise click.ClickException(str(exc)) from exc
    pid = record.process.pid if record.process else 0
    ready = f"; ready check {check.describe()}" if check else ""
    click.echo(
        f"pod/{name} running on {record.node} with IP {record.ip} "
        f"(netns {record.netns}, pid {pid}{ready})"
    )


@pod.command("exec", context_settings={"ignore_unknown_options": True})
@STATE_DIR
@NAMESPACE
@click.argument("name")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(state_dir: Path, namespace: str, name: str, command: tuple[str, ...]) -> None:
    """Run COMMAND (after `--`) in running pod NAME (its namespaces and sandbox, as the
    user its process runs as); exit with its status."""
    from podnet.cluster.pods import exec_pod

    try:
        result = exec_pod(state_dir, name, command, namespace, capture=False, timeout=None)
    except PodError as exc:
        raise click.ClickException(str(exc)) from exc
    except (FileNotFoundError, subprocess.SubprocessError) as exc:
        raise click.ClickException(f"cannot run {command[0]}: {exc}") from exc
    click.get_current_context().exit(result.returncode)


@pod.command("delete")
@STATE_DIR
@NAMESPACE
@click.argument("names", nargs=-1, required=True)
def delete(state_dir: Path, namespace: str, names: tuple[str, ...]) -> None:
    """Delete pods: stop the process, CNI DEL, remove the namespace and the Pod object."""
    from podnet.cluster.pods import delete_pod

    for name in names:
        try:
            delete_pod(state_dir, name, namespace, say=lambda line: click.echo(line, err=True))
        except PodError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f'pod "{name}" deleted')
