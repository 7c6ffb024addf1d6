"""``podnet master``'s serving flags: where it listens, and the bounds on what one client
may hold (connections per source, handshake and idle time, watches and lists per
identity: ``podnet.listener``, ``podnet.api.limits``)."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable
from typing import Any

import click

from podnet.api.limits import MAX_LISTS_PER_USER, MAX_WATCHES_PER_USER

COUNT = click.IntRange(0)
SECONDS = click.FloatRange(0.0, min_open=True)


def listen_address(value: str) -> tuple[str, int]:
    """``IP:PORT`` of ``--listen``, or a usage error."""
    host, _, port = value.rpartition(":")
    try:
        ipaddress.ip_address(host)
        return host, int(port)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r}: expected IP:PORT, e.g. 127.0.0.1:6443") from exc


def limit_options(command: Callable[..., None]) -> Callable[..., None]:
    """The bounds flags, passed to the command as ``request_limits`` and
    ``connection_limits``."""
    flags = [
        click.option(
            "--max-watches-per-user",
            default=MAX_WATCHES_PER_USER,
            show_default=True,
            type=COUNT,
            help="concurrent watches of one identity; more are 429 (0: no cap)",
        ),
        click.option(
            "--max-lists-per-user",
            default=MAX_LISTS_PER_USER,
            show_default=True,
            type=COUNT,
            help="concurrent lists of one identity; more are 429 (0: no cap)",
        ),
        click.option(
            "--max-connections-per-source",
            default=1000,
            show_default=True,
            type=COUNT,
            help="open connections from one address; more are reset (0: no cap)",
        ),
        click.option(
            "--max-connections",
            default=0,
            type=COUNT,
            help="open connections in all  [default: the descriptor limit less a reserve]",
        ),
        click.option(
            "--tls-handshake-timeout",
            default=10.0,
            show_default=True,
            type=SECONDS,
            help="seconds a client has to finish its TLS handshake",
        ),
        click.option(
            "--idle-timeout",
            default=120.0,
            show_default=True,
            type=SECONDS,
            help="seconds a connection may stay open without a request",
        ),
    ]

    @functools.wraps(command)
    def with_limits(
        *args: Any,
        max_watches_per_user: int,
        max_lists_per_user: int,
        max_connections_per_source: int,
        max_connections: int,
        tls_handshake_timeout: float,
        idle_timeout: float,
        **kwargs: Any,
    ) -> None:
        from podnet.api.limits import RequestLimits
        from podnet.listener import ConnectionLimits

        requests = RequestLimits(max_watches_per_user, max_lists_per_user)
        connections = ConnectionLimits(
            max_connections_per_source, max_connections, tls_handshake_timeout, idle_timeout
        )
        command(*args, request_limits=requests, connection_limits=connections, **kwargs)

    for flag in reversed(flags):
        with_limits = flag(with_limits)
    return with_limits
