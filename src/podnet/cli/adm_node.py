"""``podnet adm node remove NAME``: take a node out of the cluster for good.

For a node that is gone (or must go: a lost or compromised host) without waiting on its
agent: its credentials are revoked first (so it cannot re-register or write while the
rest happens), then the Pods bound to it are deleted at once (grace 0, as ``kubectl
drain`` deletes them, without waiting on an agent that may be dead), then the Node, then
its HostSubnet, which releases the subnet for other nodes. It runs as the admin (the
kubeconfig) on a master host, whose state directory's ``etcd.json`` says where the
credentials live (``podnet.api.noderevoke``).

Everything is looked up before anything changes: a node of which nothing is left (no
Node, Pods, HostSubnet or token) is an error that changes nothing, so a second run is
refused harmlessly; a run cut short is finished by the next one.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from podnet.api.noderevoke import node_tokens, revoke_node_credentials
from podnet.api.tokenstore import NoStoreSettings, StoreSettings
from podnet.cli.adm import adm
from podnet.cli.cluster_cmd import STATE_DIR
from podnet.cli.main import CliError, CliState, pass_state
from podnet.client import StatusError
from podnet.client.sync import ApiClient
from podnet.model.kinds import HOST_SUBNET, NODE, POD
from podnet.model.schemas_names import dns_subdomain_problem

MASTER_STATE_DIR = Path("/var/lib/podnet/master")
Obj = dict[str, Any]
POLL_INTERVAL = 0.2


@dataclass(frozen=True)
class Leftovers:
    """What the cluster still holds of a node."""

    node: Obj | None
    pods: list[tuple[str, str]]  # (namespace, name)
    hostsubnet: Obj | None
    tokens: int

    @property
    def empty(self) -> bool:
        return self.node is None and not self.pods and self.hostsubnet is None and not self.tokens


def _get_or_none(client: ApiClient, kind: Any, name: str) -> Obj | None:
    try:
        return client.get(kind, None, name)
    except StatusError as exc:
        if exc.code == 404:
            return None
        raise


def _bound_pods(client: ApiClient, name: str) -> list[tuple[str, str]]:
    listed = client.list(POD, None, field_selector=f"spec.nodeName={name}")
    found = []
    for item in listed.get("items") or []:
        meta = item.get("metadata") or {}
        if (item.get("spec") or {}).get("nodeName") == name:
            found.append((str(meta.get("namespace")), str(meta.get("name"))))
    return sorted(found)


def find_leftovers(client: ApiClient, settings: StoreSettings, name: str) -> Leftovers:
    """Read (never change) what the cluster holds of node ``name``."""
    hostsubnet = _get_or_none(client, HOST_SUBNET, name)
    if hostsubnet is not None and hostsubnet.get("host") != name:
        hostsubnet = None  # not this node's
    return Leftovers(
        _get_or_none(client, NODE, name),
        _bound_pods(client, name),
        hostsubnet,
        node_tokens(settings, name),
    )


def _delete(
    client: ApiClient, kind: Any, namespace: str | None, name: str, grace: int | None
) -> bool:
    """Delete one object; False when it was already gone."""
    try:
        client.delete(kind, namespace, name, grace_period_seconds=grace)
    except StatusError as exc:
        if exc.code == 404:
            return False
        raise
    return True


def _release_subnet(client: ApiClient, name: str, hostsubnet: Obj, wait: float) -> str:
    """Release the node's subnet once its Node is gone: the master's HostSubnet controller
    deletes the orphan itself (deleting it here first could race the controller's view
    of the Node into allocating a new one); after ``wait`` seconds, delete it here."""
    subnet = hostsubnet.get("subnet")
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if _get_or_none(client, HOST_SUBNET, name) is None:
            return f"hostsubnet/{name} deleted by the master: {subnet} released"
        time.sleep(POLL_INTERVAL)
    _delete(client, HOST_SUBNET, None, name, None)
    return f"hostsubnet/{name} deleted: {subnet} released"


def remove(
    client: ApiClient,
    settings: StoreSettings,
    name: str,
    found: Leftovers,
    release_wait: float = 10.0,
) -> list[str]:
    """Remove what ``found`` lists, credentials first; one line per thing done."""
    revoked = revoke_node_credentials(settings, name)
    done = [f"revoked the credentials of node {name}: {revoked} token(s), its certificates"]
    for namespace, pod in found.pods:
        if _delete(client, POD, namespace, pod, 0):
            done.append(f"pod/{pod} deleted (namespace {namespace})")
    if found.node is not None and _delete(client, NODE, None, name, None):
        done.append(f"node/{name} deleted")
    if found.hostsubnet is not None:
        done.append(_release_subnet(client, name, found.hostsubnet, release_wait))
    return done


def master_dir(master_state_dir: Path | None, cluster_state_dir: Path) -> Path:
    """The master's state directory (its ``etcd.json`` says where the credentials are):
    ``--master-state-dir``, else the local cluster's, else the master's default."""
    if master_state_dir is not None:
        return master_state_dir
    if (cluster_state_dir / "state.json").is_file():
        return cluster_state_dir / "master"
    return MASTER_STATE_DIR


def _client(state: CliState, cluster_state_dir: Path) -> ApiClient:
    """The admin's client: --kubeconfig or $KUBECONFIG, else the local cluster's admin
    kubeconfig, else ~/.kube/config."""
    admin = cluster_state_dir / "master" / "admin.kubeconfig"
    if not state.kubeconfig and not os.environ.get("KUBECONFIG") and admin.is_file():
        state.kubeconfig = str(admin)
    return state.client()


@adm.group("node")
def node_group() -> None:
    """Manage nodes."""


@node_group.command("remove")
@click.argument("name")
@click.option(
    "--master-state-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="the master's --state-dir, whose etcd.json names the credentials' store (default: "
    "the local cluster's at "
    f"--state-dir if there is one, else {MASTER_STATE_DIR})",
)
@click.option(
    "--release-wait",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="seconds to let the master release the HostSubnet before deleting it here",
)
@STATE_DIR
@pass_state
def remove_node(
    state: CliState,
    name: str,
    master_state_dir: Path | None,
    release_wait: float,
    state_dir: Path,
) -> None:
    """Remove node NAME: revoke its tokens and certificates, delete the Pods bound to it
    (at once), its Node and its HostSubnet (the subnet is released)."""
    if problem := dns_subdomain_problem(name):
        raise CliError(f"bad node name {name!r}: {problem}")
    try:
        settings = StoreSettings.require(master_dir(master_state_dir, state_dir))
    except NoStoreSettings as exc:
        raise CliError(f"{exc}: run this on a master host (or give --master-state-dir)") from exc
    client = _client(state, state_dir)
    found = find_leftovers(client, settings, name)
    if found.empty:
        raise CliError(
            f'node "{name}" not found: no Node, Pods, HostSubnet or token of it '
            "(already removed?); nothing changed"
        )
    for line in remove(client, settings, name, found, release_wait):
        click.echo(line)
    click.echo(f"node {name} removed")
