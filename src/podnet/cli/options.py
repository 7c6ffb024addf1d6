"""Option shapes the commands share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click


def choice_option(flag: str, choices: Sequence[str], default: str, help: str) -> Any:
    """``--flag`` taking one of ``choices``, with its default shown in ``--help``."""
    option: Callable[..., Any] = click.option(
        flag, type=click.Choice(list(choices)), default=default, show_default=True, help=help
    )
    return option
