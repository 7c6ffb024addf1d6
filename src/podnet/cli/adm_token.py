"""``podnet adm token create|list|delete``: bootstrap tokens, as kubeadm's.

A bootstrap token ``[a-z0-9]{6}.[a-z0-9]{16}`` (id.secret) authenticates as
``system:bootstrap:<id>`` in ``system:bootstrappers``, optionally bound to one node, and
expires after its ttl (24h by default). Its record is written straight into the master's
etcd, hashed (``podnet.api.tokenissue``), with the etcd settings the master saved in its
state dir (``--state-dir``; or ``--etcd`` and its TLS flags): only who holds the master's
etcd client certificate can issue or revoke tokens, as only they can write the records.
The secret is printed once by ``create`` and never again: ``list`` shows ids only.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from podnet.cli.adm import adm
from podnet.cli.main import CliError

T = TypeVar("T")
MASTER_STATE_DIR = Path("/var/lib/podnet/master")


def _store_options(command: Callable[..., None]) -> Callable[..., None]:
    flags = [
        click.option(
            "--state-dir",
            type=click.Path(path_type=Path, file_okay=False),
            default=MASTER_STATE_DIR,
            show_default=True,
            help="the master's state dir: its etcd.json says where the tokens live",
        ),
        click.option(
            "--etcd", "etcd", default="", help="etcd host:port[,...] (instead of etcd.json)"
        ),
        click.option("--etcd-prefix", default="", help="the master's --etcd-prefix (with --etcd)"),
        click.option("--etcd-cafile", type=click.Path(exists=True, dir_okay=False, path_type=Path)),
        click.option(
            "--etcd-certfile", type=click.Path(exists=True, dir_okay=False, path_type=Path)
        ),
        click.option(
            "--etcd-keyfile", type=click.Path(exists=True, dir_okay=False, path_type=Path)
        ),
    ]
    for flag in reversed(flags):
        command = flag(command)
    return command


def _settings(options: dict[str, Any]) -> Any:
    from podnet.api.registry import DEFAULT_PREFIX
    from podnet.api.tokenstore import NoStoreSettings, StoreSettings
    from podnet.cli.etcd_options import etcd_endpoints_text, etcd_tls

    if not options["etcd"]:
        if any(options[k] for k in ("etcd_prefix", "etcd_cafile", "etcd_certfile", "etcd_keyfile")):
            raise CliError("--etcd-prefix and the --etcd-*file flags go with --etcd")
        try:
            return StoreSettings.require(options["state_dir"])
        except NoStoreSettings as exc:
            raise CliError(str(exc)) from exc
    tls = etcd_tls(options["etcd_cafile"], options["etcd_certfile"], options["etcd_keyfile"])
    return StoreSettings(
        etcd_endpoints_text((options["etcd"],)), options["etcd_prefix"] or DEFAULT_PREFIX, tls
    )


def _run(options: dict[str, Any], work: Callable[[Any, str], Awaitable[T]]) -> T:
    from podnet.api.tokenrecords import RecordError
    from podnet.api.tokenstore import run
    from podnet.store.base import StoreError

    settings = _settings(options)
    try:
        return run(settings, lambda store: work(store, settings.prefix))
    except RecordError as exc:
        raise CliError(str(exc)) from exc
    except StoreError as exc:
        raise CliError(f"etcd at {settings.endpoints}: {exc}") from exc


@adm.group("token")
def token() -> None:
    """Bootstrap tokens (kubeadm's), stored hashed in the master's etcd."""


@token.command("create")
@click.option("--ttl", default="24h", show_default=True, help="lifetime: 30m, 24h, 7d (max 365d)")
@click.option("--node", default=None, help="the only node the token may join as (default: any)")
@click.option("--description", default="", help="a note for `adm token list`")
@_store_options
def create(ttl: str, node: str | None, description: str, **options: Any) -> None:
    """Create a bootstrap token and print it (the only time its secret is shown)."""
    from podnet.api.tokenissue import create_bootstrap
    from podnet.api.tokenrecords import RecordError, check_node_name, parse_ttl

    try:  # every input checked before anything is written
        lifetime = parse_ttl(ttl)
        bound = None if node is None else check_node_name(node)
    except RecordError as exc:
        raise CliError(str(exc)) from exc
    if len(description) > 256 or not description.isprintable():
        raise CliError("--description must be printable and at most 256 characters")
    made = _run(
        options, lambda store, prefix: create_bootstrap(store, prefix, lifetime, bound, description)
    )
    click.echo(made)


def _expires(value: datetime.datetime | None) -> str:
    if value is None:
        return "<never>"
    left = value - datetime.datetime.now(datetime.UTC)
    stamp = value.strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp} (expired)" if left.total_seconds() <= 0 else stamp


@token.command("list")
@click.option("--all", "everything", is_flag=True, help="also the components' tokens (nodes, ...)")
@_store_options
def list_(everything: bool, **options: Any) -> None:
    """List the tokens by id (never their secrets)."""
    from podnet.api.tokenissue import list_tokens

    found = _run(options, list_tokens)
    rows = [("ID", "USER", "EXPIRES", "USAGES", "NODE", "DESCRIPTION")]
    for stored in found:
        record = stored.record
        if record.bootstrap_id is None and not everything:
            continue
        rows.append(
            (
                stored.id,
                record.user,
                _expires(record.expires),
                ",".join(record.usages) or "-",
                record.node or "-",
                record.description,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo(
            "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
            + "   "
            + row[-1]
        )


@token.command("delete")
@click.argument("ident", metavar="ID")
@_store_options
def delete(ident: str, **options: Any) -> None:
    """Delete (revoke) the token ID: a bootstrap token's id, or the hex id `list --all`
    shows. Every master refuses it within 5 seconds."""
    from podnet.api.tokenissue import delete_token

    stored = _run(options, lambda store, prefix: delete_token(store, prefix, ident))
    click.echo(f"token {stored.id} ({stored.record.user}) deleted")
