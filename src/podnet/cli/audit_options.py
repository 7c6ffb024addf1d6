"""``podnet master``'s audit-log flags (``podnet.api.audit``), passed to the command as one
``audit: AuditOptions``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from podnet.api.audit import MIB, AuditOptions

DEFAULTS = AuditOptions()


def audit_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--audit-log PATH``, ``--no-audit-log``, ``--audit-log-max-size``,
    ``--audit-log-max-backups``."""
    flags = [
        click.option(
            "--audit-log",
            "audit_log",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="where the audit log of writes goes (0600)  [default: <state-dir>/audit.log]",
        ),
        click.option("--no-audit-log", is_flag=True, help="keep no audit log"),
        click.option(
            "--audit-log-max-size",
            type=click.FloatRange(0.001),
            default=DEFAULTS.max_bytes / MIB,
            show_default=True,
            help="MiB at which the audit log rotates",
        ),
        click.option(
            "--audit-log-max-backups",
            type=click.IntRange(1, 1000),
            default=DEFAULTS.backups,
            show_default=True,
            help="rotated audit logs kept (audit.log.1 ...)",
        ),
    ]

    @functools.wraps(command)
    def with_audit(
        *args: Any,
        audit_log: Path | None,
        no_audit_log: bool,
        audit_log_max_size: float,
        audit_log_max_backups: int,
        **kwargs: Any,
    ) -> None:
        if audit_log is not None and no_audit_log:
            raise click.BadParameter("give --audit-log or --no-audit-log, not both")
        audit = AuditOptions(
            enabled=not no_audit_log,
            path=audit_log,
            max_bytes=int(audit_log_max_size * MIB),
            backups=audit_log_max_backups,
        )
        command(*args, audit=audit, **kwargs)

    for flag in reversed(flags):
        with_audit = flag(with_audit)
    return with_audit
