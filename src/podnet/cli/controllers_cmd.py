"""``podnet controllers``: run the master's controllers as their own process, over HTTPS."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from podnet.cli.master_cmd import network_options, serve
from podnet.cli.options import log_options

if TYPE_CHECKING:
    from podnet.controllers.config import NetworkConfig

FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command("controllers")
@click.option("--server", required=True, help="the API's URL, e.g. https://10.0.0.1:6443")
@click.option("--token-file", type=FILE, required=True, help="a file holding the bearer token")
@click.option(
    "--certificate-authority", "ca_file", type=FILE, help="the API's CA certificate (PEM)"
)
@network_options
@click.option(
    "--leader-elect/--no-leader-elect",
    default=True,
    show_default=True,
    help="hold the Lease kube-system/podnet-controllers (through the API) while running",
)
@click.option("--lease-seconds", default=15, show_default=True, type=click.IntRange(2, 3600))
@click.option(
    "--metrics-address",
    default=None,
    help="Serve Prometheus /metrics on HOST:PORT (e.g. 127.0.0.1:9102); off by default",
)
@log_options
def controllers(
    server: str,
    token_file: Path,
    ca_file: Path | None,
    network: NetworkConfig,
    leader_elect: bool,
    lease_seconds: int,
    metrics_address: str | None,
) -> None:
    """Run the controllers against a master started with --no-controllers."""
    from podnet.controllers.process import ControllersOptions, ControllersProcess

    options = ControllersOptions(
        network, server, token_file, ca_file, leader_elect, lease_seconds,
        metrics_address=metrics_address,
    )  # fmt: skip
    serve(lambda: ControllersProcess(options), "podnet.controllers")
