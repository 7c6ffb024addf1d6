"""``podnet adm``: the ``adm`` group of :mod:`podnet.cli.adm` plus ``adm diagnose``, and
the commands of :mod:`podnet.cli.adm_backup` and :mod:`podnet.cli.adm_node`.

``podnet adm diagnose -o FILE.tar.gz`` writes a support bundle (see
:mod:`podnet.cluster.diagnose`): of the local cluster at ``--state-dir`` when one is
there, else (or with ``--host``) of this host's systemd units, network and API objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from podnet.cli import (  # noqa: F401 - they add their commands to adm
    adm_backup,
    adm_certs,
    adm_init,
    adm_join,
    adm_join_master,
    adm_node,
    adm_token,
)
from podnet.cli.adm import adm
from podnet.cli.cluster_cmd import STATE_DIR
from podnet.cli.main import CliError, CliState, pass_state

__all__ = ["adm", "diagnose"]


def _api_factory(state: CliState, kubeconfig: Path | None) -> Any:
    """A function making an API client: the given kubeconfig, else the global one."""
    from podnet.client.sync import ApiClient
    from podnet.kubeconfig import load_client_config

    if kubeconfig is not None:
        return lambda: ApiClient(load_client_config(str(kubeconfig)))
    config = state.config()
    return lambda: ApiClient(config)


def _no_api(reason: str) -> Any:
    def fail() -> Any:
        raise RuntimeError(f"no API client: {reason}")

    return fail


@adm.command("diagnose")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="the bundle to write (.tar.gz, mode 0600)",
)
@STATE_DIR
@click.option("--host", is_flag=True, help="collect this host's units, not a local cluster")
@click.option(
    "--size-cap",
    type=click.IntRange(min=1024),
    default=20 * 1024 * 1024,
    show_default=True,
    help="bytes per file in the bundle; longer files are cut, with a note",
)
@pass_state
def diagnose(state: CliState, output: Path, state_dir: Path, host: bool, size_cap: int) -> None:
    """Write a support bundle: logs, every kind's objects, each node's nftables ruleset
    or OVS flows, routes and links, and `cluster status`. Tokens and keys are redacted;
    key files, tokens files and kubeconfigs are never copied."""
    from podnet.cluster import diagnose as bundle
    from podnet.cluster.diagnose_redact import known_secrets

    local = not host and (state_dir / "state.json").is_file()
    admin = state_dir / "master" / "admin.kubeconfig"
    given = Path(state.kubeconfig) if state.kubeconfig else None
    roots = [state_dir] if local else [*bundle.HOST_SECRET_ROOTS, state_dir]
    if given is not None:
        roots.append(given)
    if local:
        items = bundle.local_plan(state_dir, _api_factory(state, given or admin))
    else:
        click.echo(f"no local cluster at {state_dir}: collecting this host", err=True)
        try:
            items = bundle.host_plan(_api_factory(state, given))
        except Exception as exc:  # no kubeconfig: the rest is still worth having
            items = [*bundle.host_plan(None), ("objects/", _no_api(str(exc)))]
    if not output.parent.is_dir():
        raise CliError(f"no such directory: {output.parent}")
    report = bundle.write_bundle(output, items, known_secrets(roots), cap=size_cap)
    click.echo(
        f"wrote {output}: {len(report.members)} files, {len(report.cut)} cut, "
        f"{len(report.errors)} errors (see errors.txt in the bundle)"
    )
