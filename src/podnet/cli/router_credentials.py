"""``podnet router-credentials``: the router's own identity, issued on the master's host.

The router (``podnet router``) runs as user ``system:podnet:router:<name>`` in group
``system:podnet:routers`` (``podnet.api.roles.ROUTER_RULES``): it reads Routes, Services,
Endpoints and EndpointSlices in every namespace and writes ``routes/status``, nothing
else. Its token is written as a token file plus the API's CA (as for ``podnet
controllers``), and/or as a kubeconfig; each file holding the token is 0600.
"""

from __future__ import annotations

from pathlib import Path

import click

from podnet.cli.master_cmd import STATE_DIR_OPTION


@click.command("router-credentials")
@click.argument("name")
@STATE_DIR_OPTION
@click.option("--token-file", type=click.Path(path_type=Path), help="written 0600")
@click.option("--ca-file", type=click.Path(path_type=Path), help="the API's CA")
@click.option("-o", "--kubeconfig", type=click.Path(path_type=Path), help="written 0600")
@click.option("--server", default="", help="the API URL for --kubeconfig")
def router_credentials(
    name: str,
    state_dir: Path,
    token_file: Path | None,
    ca_file: Path | None,
    kubeconfig: Path | None,
    server: str,
) -> None:
    """Issue a token for the router NAME (group system:podnet:routers: reads routes,
    services, endpoints and endpointslices, writes routes/status only), as --token-file
    and --ca-file and/or as a kubeconfig (-o with --server)."""
    from podnet.master import router_credentials as issue

    if (token_file is None) != (ca_file is None):
        raise click.UsageError("give --token-file and --ca-file together")
    if (kubeconfig is None) != (not server):
        raise click.UsageError("give -o/--kubeconfig and --server together")
    if token_file is None and kubeconfig is None:
        raise click.UsageError("give --token-file and --ca-file, or -o and --server")
    issue(
        state_dir,
        name,
        token_file=token_file,
        ca_file=ca_file,
        kubeconfig=kubeconfig,
        server=server,
    )
    written = [str(p) for p in (token_file, ca_file, kubeconfig) if p is not None]
    click.echo(f"credentials for router {name} written to {', '.join(written)}")
