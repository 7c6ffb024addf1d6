"""Option shapes the commands share, and the daemons' logging flags."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click

from podnet.logsetup import FORMATS, LEVELS, configure


def choice_option(flag: str, choices: Sequence[str], default: str, help: str) -> Any:
    """``--flag`` taking one of ``choices``, with its default shown in ``--help``."""
    option: Callable[..., Any] = click.option(
        flag, type=click.Choice(list(choices)), default=default, show_default=True, help=help
    )
    return option


# ---- --log-level and --log-format, on every daemon (podnet.logsetup) -----------------


def _remember(ctx: click.Context, param: click.Parameter, value: str) -> str:
    ctx.meta[f"podnet.{param.name}"] = value
    return value


LOG_FLAGS = (
    click.option(
        "--log-level",
        type=click.Choice(LEVELS, case_sensitive=False),
        default="info",
        show_default=True,
        expose_value=False,
        callback=_remember,
        help="log records of this level and above",
    ),
    click.option(
        "--log-format",
        type=click.Choice(FORMATS, case_sensitive=False),
        default="text",
        show_default=True,
        expose_value=False,
        callback=_remember,
        help="text, or json: one object per line (time, level, logger, message, exception)",
    ),
)


def log_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--log-level`` and ``--log-format``; ``log_to_stderr`` applies them."""
    for flag in reversed(LOG_FLAGS):
        command = flag(command)
    return command


def log_to_stderr() -> None:
    """Log to stderr as the running command's ``--log-level`` and ``--log-format`` say."""
    context = click.get_current_context(silent=True)
    meta = context.meta if context is not None else {}
    configure(meta.get("podnet.log_level", "info"), meta.get("podnet.log_format", "text"))
