"""``podnet router``: serve the cluster's Routes with HAProxy until SIGTERM or SIGINT."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import click

from podnet.cli.master_cmd import serve
from podnet.cli.options import log_options

DEFAULT_METRICS = "127.0.0.1:1936"  # OpenShift's router stats port, on the loopback only
DEFAULT_RUN_DIR = Path("/run/podnet/router")
PORT = click.IntRange(1, 65535)


def _address(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not an IP address") from exc


@click.command("router")
@click.option("--name", default="default", show_default=True, help="in routes' status.ingress")
@click.option("--bind", default="0.0.0.0", show_default=True, callback=_address,
              help="the address HTTP and HTTPS listen on")  # fmt: skip
@click.option("--http-port", default=80, show_default=True, type=PORT)
@click.option("--https-port", default=443, show_default=True, type=PORT)
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path),
              default=DEFAULT_RUN_DIR, show_default=True,
              help="HAProxy's config, maps, certificates and sockets (made 0700)")  # fmt: skip
@click.option("--default-certificate", type=click.Path(dir_okay=False, path_type=Path),
              help="PEM (certificate, key, chain) for names no route serves; "
              "default: a self-signed one made in the run dir")  # fmt: skip
@click.option("--metrics", "metrics_address", default=DEFAULT_METRICS, show_default=True,
              help="HOST:PORT of /metrics (Prometheus)")  # fmt: skip
@click.option("--reload-interval", default=0.5, show_default=True,
              type=click.FloatRange(0.0, 60.0),
              help="seconds between two HAProxy reloads (changes between are merged)")  # fmt: skip
@log_options
@click.pass_context
def router(ctx: click.Context, **flags: Any) -> None:
    """Run the router: watch Routes, Services and EndpointSlices and drive HAProxy.

    Its credentials come from the global --kubeconfig (the restricted identity from
    ``podnet router-credentials``, or an administrator's), else $KUBECONFIG.
    """
    from podnet.kubeconfig import load_client_config
    from podnet.router.process import RouterOptions, RouterProcess

    if flags["http_port"] == flags["https_port"]:
        raise click.BadParameter("--http-port and --https-port must differ")
    kubeconfig = getattr(ctx.find_root().obj, "kubeconfig", None)
    options = RouterOptions(client=load_client_config(kubeconfig), **flags)
    serve(lambda: RouterProcess(options), "podnet.router")
