"""The contract tests' harness of every registered data plane, by name, and ``opened``.

The harnesses themselves live beside their implementation's test views:
``podnet.testing.dataplanes`` (fake, linux) and ``podnet.testing.ovsharness`` (ovs, built
on the linux one). A new implementation adds its harness to ``HARNESSES`` here; until it
does, the contract tests fail for it (they never skip).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from podnet.testing.dataplanes import FakeHarness, Harness, LinuxHarness
from podnet.testing.lab import Lab, unique_run
from podnet.testing.ovsharness import OvsHarness

HARNESSES: dict[str, type[Harness]] = {h.name: h for h in (FakeHarness, LinuxHarness, OvsHarness)}


def harness_class(name: str) -> type[Harness]:
    """The harness of registered implementation ``name``."""
    found = HARNESSES.get(name)
    if found is None:
        raise LookupError(
            f"data plane {name!r} is registered but has no harness in podnet.testing.harnesses"
        )
    return found


@contextlib.asynccontextmanager
async def opened(name: str, state_dir: Path) -> AsyncIterator[Harness]:
    """Implementation ``name`` with one plane open; planes closed and namespaces removed
    afterwards, even when the body fails."""
    kind = harness_class(name)
    lab = Lab(unique_run("pnc"))
    harness = kind(lab, state_dir)
    try:
        if kind.lab_nodes:
            lab.build(kind.lab_nodes)
        await harness.open()
        yield harness
    finally:
        try:
            await harness.close()
        finally:
            await lab.close()
