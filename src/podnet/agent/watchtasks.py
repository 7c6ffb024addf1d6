"""The supervised tasks of a reconcile loop that watches kinds: the loop, then one watch
per kind (``policy-sync``, ``policy-watch-pods``, ...), as the agent runs them."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from podnet.model.kinds import Kind

Task = tuple[str, Callable[[], Coroutine[Any, Any, None]]]


def loop_tasks(
    name: str,
    run: Callable[[], Coroutine[Any, Any, None]],
    watch: Callable[[Kind], Coroutine[Any, Any, None]],
    kinds: Iterable[Kind],
) -> list[Task]:
    """(task name, coroutine function) for the loop ``run`` and ``watch`` of each kind."""
    found: list[Task] = [(f"{name}-sync", run)]
    found += [(f"{name}-watch-{kind.plural}", functools.partial(watch, kind)) for kind in kinds]
    return found
