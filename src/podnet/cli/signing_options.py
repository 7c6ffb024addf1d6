"""``podnet master --cluster-signing-duration``: how long the client certificates the
master's CSR signer issues are valid (kube-controller-manager's flag of that name).

A CSR's ``spec.expirationSeconds`` may ask for less, never more. Nodes rotate their
certificate at 70-90 % of its life (``podnet.agent.certrotation``), so the duration is
also how often each node asks for a new one: at least a minute, at most a year.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import click

from podnet.api.pki import CLIENT_VALIDITY, MIN_SIGNING_DURATION


def _text(duration: dt.timedelta) -> str:
    seconds = int(duration.total_seconds())
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class SigningDuration(click.ParamType):
    """``8760h``, ``30d``, ``90m``, ``1h30m``... between a minute and a year."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, dt.timedelta):
            return value
        from podnet.api.tokenrecords import RecordError, parse_ttl

        try:
            duration = parse_ttl(str(value))
        except RecordError as exc:
            self.fail(str(exc).replace("bad ttl", "bad duration"), param, ctx)
        if duration < MIN_SIGNING_DURATION:
            self.fail(f"{value!r} is shorter than {_text(MIN_SIGNING_DURATION)}", param, ctx)
        return duration


CLUSTER_SIGNING_DURATION = click.option(
    "--cluster-signing-duration",
    type=SigningDuration(),
    default=_text(CLIENT_VALIDITY),
    show_default=True,
    help="how long the client certificates the master signs (node certificates) are "
    "valid; a CSR's expirationSeconds may ask for less; nodes renew theirs at 70-90 % "
    "of it (between 1m and 8760h; s, m, h, d and combinations such as 1h30m)",
)
