"""Fixtures shared by the unit tests of the controllers: a registry over an in-memory
store, and the in-process object API over it (with a running watch cache)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from podnet.api.registry import Registry
from podnet.controllers.inprocess import InProcessApi
from podnet.store.memory import MemoryStore


@pytest.fixture
def registry() -> Registry:
    return Registry(MemoryStore(), prefix="/t/")


@pytest.fixture
async def api(registry: Registry) -> AsyncIterator[InProcessApi]:
    """The in-process object API over ``registry`` and a running watch cache."""
    async with InProcessApi.standalone(registry) as in_process:
        yield in_process
