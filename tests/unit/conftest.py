"""Fixtures shared by the unit tests of the controllers: a registry over an in-memory
store, and the in-process object API over it (with a running watch cache)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from podnet.agent import cniplugin
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


@pytest.fixture
def no_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in CNI plugin: the real shim build is covered by the integration test."""

    def install(bin_dir: Path, python: str) -> Path:
        bin_dir.mkdir(parents=True, exist_ok=True)
        (bin_dir / "podnet").write_text("#!/bin/false\n")
        return bin_dir / "podnet"

    monkeypatch.setattr(cniplugin, "install_shim", install)
