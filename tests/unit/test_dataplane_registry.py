"""The data plane registry: implementations by name, and ``podnet node`` choosing from it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from podnet.cli.main import cli
from podnet.dataplane import registry
from podnet.dataplane.fake import FakeDataPlane


def test_linux_and_fake_are_registered() -> None:
    assert {"linux", "fake"} <= set(registry.names())
    assert registry.names() == sorted(registry.names())
    assert registry.implementation("linux").summary


def test_an_unknown_name_is_refused_with_the_known_ones() -> None:
    with pytest.raises(registry.UnknownDataPlane) as caught:
        registry.implementation("ovs-nope")
    assert str(caught.value) == (
        f"unknown data plane 'ovs-nope' (known: {', '.join(registry.names())})"
    )


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="'fake' is already registered"):
        registry.register("fake", registry.implementation("linux").factory, "again")
    assert registry.implementation("fake").factory is not registry.implementation("linux").factory


async def test_the_fake_factory_keeps_its_state_in_the_state_dir(tmp_path: Path) -> None:
    options = registry.DataPlaneOptions(state_dir=tmp_path / "agent")
    plane = await registry.create("fake", options)
    assert isinstance(plane, FakeDataPlane)
    assert plane.state_file == tmp_path / "agent" / "fake-dataplane.json"
    assert (tmp_path / "agent").stat().st_mode & 0o777 == 0o700


def test_podnet_node_offers_the_registered_names_and_the_tunnels() -> None:
    runner = CliRunner()
    usage = runner.invoke(cli, ["node", "--help"]).output
    assert "[vxlan|host-gw]" in usage and "--backend" not in usage
    assert f"[{'|'.join(registry.names())}]" in usage
    wrong = runner.invoke(cli, ["node", "--dataplane", "ovs-nope"])
    assert wrong.exit_code == 1
    assert "'ovs-nope' is not one of 'fake', 'linux'" in wrong.output
