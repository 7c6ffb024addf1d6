"""The etcd connection flags' values, checked as every command that talks to etcd takes
them (``podnet master``, ``adm backup``, ``adm token``): ``--etcd`` (repeated or
comma-separated host:port) and the three TLS files, all or none."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from podnet.store.etcd_pki import EtcdTls


def etcd_endpoints(values: tuple[str, ...]) -> list[tuple[str, int]]:
    """The (host, port) pairs of ``--etcd`` values; a usage error names the flag."""
    from podnet.store.etcd_client import EndpointError, parse_endpoints

    try:
        return list(parse_endpoints(values))
    except EndpointError as exc:
        raise click.BadParameter(str(exc), param_hint="--etcd") from exc


def etcd_endpoints_text(values: tuple[str, ...]) -> str:
    """``--etcd`` values as one comma-separated list, as ``podnet master`` keeps it."""
    return ",".join(f"{host}:{port}" for host, port in etcd_endpoints(values))


def etcd_tls(ca: Path | None, cert: Path | None, key: Path | None) -> EtcdTls | None:
    """The client TLS settings: all three files, or none (plain etcd)."""
    from podnet.store.etcd_pki import EtcdTls

    given = [p for p in (ca, cert, key) if p is not None]
    if not given:
        return None
    if len(given) != 3:
        raise click.BadParameter(
            "give all of --etcd-cafile, --etcd-certfile and --etcd-keyfile, or none"
        )
    assert ca is not None and cert is not None and key is not None
    return EtcdTls(ca, cert, key)
