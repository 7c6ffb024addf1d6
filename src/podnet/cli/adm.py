"""``podnet adm pod-network``: join, isolate or globalise projects' virtual networks.

Each command asks the master for a VNID change the way ``oc adm pod-network`` does: it
sets the ``pod.network.openshift.io/multitenant.change-network`` annotation on every
NetNamespace, then polls until the master has applied the change and removed it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from podnet.cli.main import CliError, CliState, pass_state
from podnet.client import StatusError
from podnet.client.sync import ApiClient
from podnet.model.kinds import CLUSTER_NETWORK, NET_NAMESPACE

CHANGE_NETWORK = "pod.network.openshift.io/multitenant.change-network"
POLL_INTERVAL = 0.2
SUBNET_PLUGIN = "redhat/openshift-ovs-subnet"


@dataclass(frozen=True)
class Change:
    """One requested change: the annotation value and how to report it when done."""

    value: str
    done: Callable[[str, Any], str]


def _require(client: ApiClient, name: str, role: str = "") -> dict[str, Any]:
    try:
        return client.get(NET_NAMESPACE, None, name)
    except StatusError as exc:
        if exc.code == 404:
            raise CliError(f'netnamespace "{name}"{role} not found') from exc
        raise


def _check_plugin(client: ApiClient) -> None:
    """Refuse early on a flat (subnet) cluster, where nobody would act on the annotation."""
    try:
        plugin = client.get(CLUSTER_NETWORK, None, "default").get("pluginName")
    except StatusError:
        return
    if plugin == SUBNET_PLUGIN:
        raise CliError(
            f"the cluster network plugin is {plugin}; pod-network changes need "
            "the multitenant or networkpolicy plugin"
        )


def _netid(obj: dict[str, Any]) -> Any:
    return obj.get("netid")


def _annotation(obj: dict[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(CHANGE_NETWORK)


def wait_applied(client: ApiClient, name: str, deadline: float, timeout: float) -> dict[str, Any]:
    """Poll the NetNamespace until the master has removed the change annotation."""
    while True:
        try:
            obj = client.get(NET_NAMESPACE, None, name)
        except StatusError as exc:
            if exc.code == 404:
                raise CliError(f'netnamespace "{name}" was deleted during the change') from exc
            raise
        if _annotation(obj) is None:
            return obj
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CliError(
                f'the master did not apply the change to netnamespace "{name}" within '
                f"{timeout:g}s (is the master running in multitenant or networkpolicy mode?)"
            )
        time.sleep(min(POLL_INTERVAL, remaining))


def change_network(state: CliState, names: list[str], change: Change, timeout: float) -> None:
    """Check every NetNamespace exists, annotate them all, then wait for each."""
    client = state.client()
    unique = list(dict.fromkeys(names))
    for name in unique:
        _require(client, name)
    _check_plugin(client)
    patch = {"metadata": {"annotations": {CHANGE_NETWORK: change.value}}}
    for name in unique:
        client.patch(NET_NAMESPACE, None, name, patch)
    deadline = time.monotonic() + timeout
    for name in unique:
        obj = wait_applied(client, name, deadline, timeout)
        click.echo(change.done(name, _netid(obj)))


timeout_option = click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to wait for the master to apply each change.",
)


@click.group("adm")
def adm() -> None:
    """Administrative commands."""


@adm.group("pod-network")
def pod_network() -> None:
    """Manage projects' virtual networks (multitenant mode)."""


@pod_network.command("join-projects")
@click.option("--to", "target", required=True, help="Project whose network the others join.")
@click.argument("projects", nargs=-1, required=True)
@timeout_option
@pass_state
def join_projects(state: CliState, target: str, projects: tuple[str, ...], timeout: float) -> None:
    """Give PROJECTS the VNID of the --to project."""
    _require(state.client(), target, " (the --to project)")
    names = [p for p in projects if p != target]
    if not names:
        raise CliError("name at least one project other than the --to project")
    change = Change(
        f"join:{target}", lambda n, i: f"netnamespace/{n} joined to {target} (netid {i})"
    )
    change_network(state, names, change, timeout)


@pod_network.command("isolate-projects")
@click.argument("projects", nargs=-1, required=True)
@timeout_option
@pass_state
def isolate_projects(state: CliState, projects: tuple[str, ...], timeout: float) -> None:
    """Give each of PROJECTS a VNID of its own."""
    change = Change("isolate", lambda n, i: f"netnamespace/{n} isolated (netid {i})")
    change_network(state, list(projects), change, timeout)


@pod_network.command("make-projects-global")
@click.argument("projects", nargs=-1, required=True)
@timeout_option
@pass_state
def make_projects_global(state: CliState, projects: tuple[str, ...], timeout: float) -> None:
    """Give PROJECTS VNID 0: they reach, and are reached by, every project."""
    change = Change("global", lambda n, i: f"netnamespace/{n} made global (netid {i})")
    change_network(state, list(projects), change, timeout)
