"""``podnet router``: serve the cluster's Routes with HAProxy until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path

import click

from podnet.cli.master_cmd import log_to_stderr, run_until_signalled

DEFAULT_METRICS = "127.0.0.1:1936"  # OpenShift's router stats port, on the loopback only
DEFAULT_RUN_DIR = Path("/run/podnet/router")


def _address(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not an IP address") from exc


@click.command("router")
@click.option(
    "--name",
    default="default",
    show_default=True,
    help="the router's name in each route's status.ingress",
)
@click.option(
    "--bind",
    "bind_address",
    default="0.0.0.0",
    show_default=True,
    help="the address HTTP and HTTPS listen on",
)
@click.option("--http-port", default=80, show_default=True, type=click.IntRange(1, 65535))
@click.option("--https-port", default=443, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_RUN_DIR,
    show_default=True,
    help="HAProxy's config, maps, certificates and sockets (made 0700)",
)
@click.option(
    "--default-certificate",
    type=click.Path(dir_okay=False, path_type=Path),
    help="PEM (certificate, key, chain) for names no route serves; "
    "default: a self-signed one made in the run dir",
)
@click.option(
    "--metrics",
    "metrics_address",
    default=DEFAULT_METRICS,
    show_default=True,
    help="HOST:PORT of /metrics (Prometheus)",
)
@click.option(
    "--reload-interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.0, 60.0),
    help="seconds between two HAProxy reloads (changes in between are merged)",
)
@click.pass_context
def router(
    ctx: click.Context,
    name: str,
    bind_address: str,
    http_port: int,
    https_port: int,
    run_dir: Path,
    default_certificate: Path | None,
    metrics_address: str,
    reload_interval: float,
) -> None:
    """Run the router: watch Routes, Services and EndpointSlices and drive HAProxy.

    Its credentials come from the global --kubeconfig (the restricted identity from
    ``podnet router-credentials``, or an administrator's), else $KUBECONFIG.
    """
    from podnet.kubeconfig import load_client_config
    from podnet.router.process import RouterOptions, RouterProcess

    if http_port == https_port:
        raise click.BadParameter("--http-port and --https-port must differ")
    kubeconfig = getattr(ctx.find_root().obj, "kubeconfig", None)
    options = RouterOptions(
        client=load_client_config(kubeconfig),
        name=name,
        bind=_address(bind_address),
        http_port=http_port,
        https_port=https_port,
        run_dir=run_dir,
        default_certificate=default_certificate,
        metrics_address=metrics_address,
        reload_interval=reload_interval,
    )
    try:
        process = RouterProcess(options)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    log_to_stderr()
    asyncio.run(run_until_signalled(process, "podnet.router"))
