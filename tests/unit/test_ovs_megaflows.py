"""The datapath's flow cache after a policy change (``megaflows``): ``sync_policy`` drops
it right after the bundle that changed the verdicts, and only then."""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from podnet.dataplane.interface import pod_mac
from podnet.dataplane.ovs import megaflows
from podnet.dataplane.ovs.backend import OvsDataPlane
from podnet.dataplane.ovs.flowsync import FlowSync
from podnet.dataplane.ovs.ofctl import FakeFlowRunner
from podnet.dataplane.ovs.pipeline import LocalPod
from podnet.model.network import MULTITENANT
from podnet.policy.model import RuleSet, VnidIsolation
from podnet.testing.nodenetwork import node_network

NODE = node_network("node-1", "198.51.100.11", "10.128.0.0/23")
POD = IPv4Address("10.128.0.5")


class Switch(FakeFlowRunner):
    """The in-memory switch, answering ``revalidator/purge`` on its control socket."""

    async def appctl(self, command: str, *args: str) -> str:
        self.calls.append(("appctl", command, " ".join(args)))
        return ""

    def ops(self) -> list[str]:
        return [op if op != "appctl" else what for op, what, _ in self.calls]


def project(vnid: int) -> RuleSet:
    """Multitenant: the one local pod in a project with ``vnid``."""
    isolation = VnidIsolation(((POD, vnid),), frozenset())
    return RuleSet(MULTITENANT, (), frozenset(), isolation=isolation)


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[tuple[OvsDataPlane, Switch]]:
    """A plane whose switch is the fake, set up for ``NODE`` with one pod."""
    switch = Switch()
    plane = OvsDataPlane(tmp_path)
    plane.runner, plane.flows = switch, FlowSync(switch)  # type: ignore[assignment]
    plane.state.node, plane.state.remotes = NODE, []
    plane.state.pods["c5/eth0"] = LocalPod("c5/eth0", 3, POD, pod_mac(POD))
    try:
        yield plane, switch
    finally:
        plane._stop_threads()


def test_verdicts_changed() -> None:
    assert megaflows.verdicts_changed("bundle", same_rules=False)
    assert megaflows.verdicts_changed("replace", same_rules=False)  # first rules after start
    assert not megaflows.verdicts_changed("replace", same_rules=True)  # the periodic resync
    assert not megaflows.verdicts_changed("none", same_rules=False)


async def test_a_policy_change_purges_the_datapath_after_its_bundle(
    plane: tuple[OvsDataPlane, Switch],
) -> None:
    the, switch = plane
    first = project(10)
    await the.sync_policy(NODE, first)  # the first rules: the whole table, then a purge
    assert switch.ops()[-1] == megaflows.PURGE
    switch.calls.clear()

    await the.sync_policy(NODE, project(11))  # another VNID: a bundle, then the purge
    assert switch.ops() == ["bundle", megaflows.PURGE]


async def test_a_resync_or_an_unchanged_rule_set_keeps_the_cache(
    plane: tuple[OvsDataPlane, Switch],
) -> None:
    the, switch = plane
    rules = project(10)
    await the.sync_policy(NODE, rules)
    switch.calls.clear()

    await the.sync_policy(NODE, rules)  # the same rules again: a whole-table resync
    assert "replace-flows" in switch.ops() and megaflows.PURGE not in switch.ops()
    switch.calls.clear()

    await the.sync_policy(NODE, project(10))  # equal rules, a new object: nothing to send
    assert switch.ops() == []
