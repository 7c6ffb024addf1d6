"""The data plane implementations by name: ``podnet node --dataplane NAME`` picks one here.

Each implementation registers a factory that builds its ``DataPlane`` in the calling
thread's network namespace. A factory imports its implementation only when called, so
choosing ``fake`` never loads netlink, and a new implementation (``ovs``) is one
``register`` call below plus the contract tests
(``tests/integration/test_dataplane_contract.py``) passing against it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from podnet.dataplane.interface import DataPlane


@dataclass(frozen=True)
class DataPlaneOptions:
    """What the agent hands every factory; an implementation uses what it needs."""

    state_dir: Path  # the agent's own directory (the fake keeps its "kernel" here)


Factory = Callable[[DataPlaneOptions], Awaitable["DataPlane"]]


@dataclass(frozen=True)
class Implementation:
    """One registered data plane implementation."""

    name: str
    summary: str
    factory: Factory
    gateway_device: str = "br0"  # the device holding the pod gateway (the DNS binds to it)


class UnknownDataPlane(LookupError):
    """No implementation is registered under the name asked for."""


_IMPLEMENTATIONS: dict[str, Implementation] = {}


def register(name: str, factory: Factory, summary: str, gateway_device: str = "br0") -> None:
    """Make ``factory`` available as ``name``; a second registration of a name fails."""
    if name in _IMPLEMENTATIONS:
        raise ValueError(f"data plane {name!r} is already registered")
    _IMPLEMENTATIONS[name] = Implementation(name, summary, factory, gateway_device)


def names() -> list[str]:
    """Every registered name, sorted."""
    return sorted(_IMPLEMENTATIONS)


def implementation(name: str) -> Implementation:
    """The implementation registered as ``name``."""
    try:
        return _IMPLEMENTATIONS[name]
    except KeyError:
        known = ", ".join(names())
        raise UnknownDataPlane(f"unknown data plane {name!r} (known: {known})") from None


async def create(name: str, options: DataPlaneOptions) -> DataPlane:
    """A new ``DataPlane`` of implementation ``name``, in this thread's namespace."""
    return await implementation(name).factory(options)


async def _linux(options: DataPlaneOptions) -> DataPlane:
    from podnet.dataplane.linux import LinuxDataPlane

    return await LinuxDataPlane.create()


async def _fake(options: DataPlaneOptions) -> DataPlane:
    from podnet.dataplane.fake import FakeDataPlane

    options.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return FakeDataPlane(state_file=options.state_dir / "fake-dataplane.json")


def ovs_base(state_dir: Path) -> Path:
    """Where the ``ovs`` plane of an agent with ``state_dir`` keeps its OVS instance
    (``cluster down`` and ``cluster status`` find a node's daemons here)."""
    return state_dir / "ovs"


async def _ovs(options: DataPlaneOptions) -> DataPlane:
    from podnet.dataplane.ovs.backend import OvsDataPlane

    options.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return await OvsDataPlane.create(ovs_base(options.state_dir))


register("linux", _linux, "Linux bridge br0, VXLAN or host-gw routes, nftables")
register(
    "ovs",
    _ovs,
    "Open vSwitch br0 (OpenShift SDN's OpenFlow pipeline), its own daemons",
    gateway_device="tun0",
)
register("fake", _fake, "in memory, validating; state in the agent's state dir (tests only)")
