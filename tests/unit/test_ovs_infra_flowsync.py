"""FlowSync on the in-memory switch: what it sends and when, and the fake itself."""

from __future__ import annotations

import pytest

from podnet.dataplane.interface import DataPlaneError, DataPlaneRejected
from podnet.dataplane.ovs import tables
from podnet.dataplane.ovs.flow import Flow, Kind, cookie
from podnet.dataplane.ovs.flowsync import FlowSync, bundle_text, group, note_flow, same_flows
from podnet.dataplane.ovs.ofctl import FakeFlowRunner, parse_flow

POD_A = cookie(Kind.POD, "a")
POD_B = cookie(Kind.POD, "b")
NODE = cookie(Kind.NODE, "node")
NOTE = note_flow(b"\x01")


def pod(key: int, port: int, vnid: int = 0) -> list[Flow]:
    return [
        Flow(tables.POD_IN, 100, f"ip,in_port={port}", f"load:{vnid}->NXM_NX_REG0[]", key),
        Flow(tables.LOCAL, 100, f"ip,nw_dst=10.0.0.{port}", f"output:{port}", key),
    ]


def desired(vnid_a: int = 0, with_b: bool = True, note: Flow = NOTE) -> list[Flow]:
    flows = [Flow(tables.CLASSIFY, 0, "", "drop", NODE), *pod(POD_A, 3, vnid_a), note]
    return flows + (pod(POD_B, 4) if with_b else [])


@pytest.fixture
def switch() -> FakeFlowRunner:
    return FakeFlowRunner()


async def test_first_sync_replaces_the_table_then_writes_the_note(switch: FakeFlowRunner) -> None:
    result = await FlowSync(switch).sync(desired())
    assert result.mode == "replace" and result.groups == 4
    ops = [op for op, _, _ in switch.calls]
    assert ops == ["dump-flows", "replace-flows", "bundle"]
    replaced, note_bundle = switch.calls[1][2], switch.calls[2][2]
    assert "note:" not in replaced, "the note comes after the rest"
    assert note_bundle == f"add {NOTE.text()}\n"
    assert len(switch.tables["br0"]) == 6


async def test_a_restarted_agent_with_the_right_flows_sends_one_replace(
    switch: FakeFlowRunner,
) -> None:
    await FlowSync(switch).sync(desired())
    before = dict(switch.tables["br0"])
    switch.calls.clear()
    result = await FlowSync(switch).sync(desired())  # a new agent
    assert result.mode == "replace"
    assert [op for op, _, _ in switch.calls] == ["dump-flows", "replace-flows"]
    assert switch.tables["br0"] == before


async def test_nothing_changed_sends_nothing(switch: FakeFlowRunner) -> None:
    sync = FlowSync(switch)
    await sync.sync(desired())
    switch.calls.clear()
    assert (await sync.sync(list(reversed(desired())))).mode == "none"
    assert switch.calls == []


async def test_one_changed_group_is_one_bundle_of_that_group(switch: FakeFlowRunner) -> None:
    sync = FlowSync(switch)
    await sync.sync(desired())
    switch.calls.clear()
    result = await sync.sync(desired(vnid_a=7))
    assert result.mode == "bundle" and result.groups == 1
    expected = f"delete cookie={POD_A:#x}/-1\n" + "".join(
        f"add {f.text()}\n" for f in sorted(pod(POD_A, 3, 7))
    )
    assert switch.calls == [("bundle", "br0", expected)]
    assert any("load:7" in f.actions for f in switch.tables["br0"].values())


async def test_a_removed_group_is_deleted_and_an_added_one_added(switch: FakeFlowRunner) -> None:
    sync = FlowSync(switch)
    await sync.sync(desired(with_b=False))
    switch.calls.clear()
    await sync.sync(desired(with_b=True))
    assert switch.calls[0][2] == "".join(f"add {f.text()}\n" for f in sorted(pod(POD_B, 4)))
    switch.calls.clear()
    await sync.sync(desired(with_b=False))
    assert switch.calls == [("bundle", "br0", f"delete cookie={POD_B:#x}/-1\n")]
    assert not any(f.cookie == POD_B for f in switch.tables["br0"].values())


async def test_a_new_note_goes_in_a_second_bundle_after_the_rest(switch: FakeFlowRunner) -> None:
    sync = FlowSync(switch)
    await sync.sync(desired())
    switch.calls.clear()
    new_note = note_flow(b"\x02")
    await sync.sync(desired(vnid_a=5, note=new_note))
    assert [text.count("note:") for _, _, text in switch.calls] == [0, 1]
    assert switch.calls[1][2] == f"delete cookie={NOTE.cookie:#x}/-1\nadd {new_note.text()}\n"


async def test_a_wrong_note_at_start_is_kept_until_the_rest_is_in(switch: FakeFlowRunner) -> None:
    await FlowSync(switch).sync(desired())
    switch.calls.clear()
    new_note = note_flow(b"\x02")
    await FlowSync(switch).sync(desired(vnid_a=5, note=new_note))
    op, _, replaced = switch.calls[1]
    assert op == "replace-flows" and "note:01.00" in replaced and "note:02" not in replaced
    assert switch.calls[2][2] == f"delete cookie={NOTE.cookie:#x}/-1\nadd {new_note.text()}\n"
    assert await FlowSync(switch).note_ok(desired(note=new_note))


async def test_a_refused_bundle_changes_nothing_and_is_retried_alone(
    switch: FakeFlowRunner,
) -> None:
    sync = FlowSync(switch)
    await sync.sync(desired())
    before = dict(switch.tables["br0"])
    bad = [*desired(with_b=False), Flow(tables.LOCAL, 100, "ip,nw_dst=10.0.0.4", "group:9", POD_B)]
    with pytest.raises(DataPlaneRejected, match="OFPBAC_BAD_OUT_GROUP"):
        await sync.sync(bad)
    assert switch.tables["br0"] == before
    switch.calls.clear()
    await sync.sync(desired(vnid_a=3))  # still knows what is applied: one bundle, group A
    assert [op for op, _, _ in switch.calls] == ["bundle"]
    assert f"{POD_A:#x}" in switch.calls[0][2] and f"{POD_B:#x}" not in switch.calls[0][2]


async def test_a_switch_away_or_restarted_means_a_replace_next_time(
    switch: FakeFlowRunner,
) -> None:
    sync = FlowSync(switch)
    await sync.sync(desired())
    switch.reachable = False
    with pytest.raises(DataPlaneError):
        await sync.sync(desired(vnid_a=1))
    switch.reachable = True
    assert (await sync.sync(desired(vnid_a=1))).mode == "replace"
    switch.restart()
    sync.forget()
    assert (await sync.sync(desired(vnid_a=1))).mode == "replace"
    assert len(switch.tables["br0"]) == 6


def test_flows_need_a_cookie_and_distinct_matches() -> None:
    with pytest.raises(DataPlaneRejected, match="without a cookie"):
        group([Flow(0, 0, "", "drop")])
    with pytest.raises(DataPlaneRejected, match="match alike"):
        group([Flow(0, 1, "ip", "drop", POD_A), Flow(0, 1, "ip", "drop", POD_B)])


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        (b"", "00.00.00.00.00.00"),
        (b"\x07\x01", "07.01.00.00.00.00"),
        (b"\x01\x02\x03\x04\x05\x06", "01.02.03.04.05.06"),
        (b"\x01" * 7, "01." * 7 + "00." * 6 + "00"),
    ],
)
def test_the_note_is_padded_as_ovs_pads_it(data: bytes, shown: str) -> None:
    flow = note_flow(data)
    assert flow.actions == f"note:{shown}"
    assert (flow.table, kind_byte(flow.cookie)) == (tables.NOTE, Kind.NOTE)


def kind_byte(value: int) -> int:
    return value >> 56


def test_texts_are_deterministic() -> None:
    one, two = group(desired()), group(list(reversed(desired())))
    assert one == two
    assert bundle_text({}, one, one) == bundle_text({}, two, reversed(list(two)))


def test_same_flows_reads_a_real_dump_line() -> None:
    dumped = f" cookie={NOTE.cookie:#x}, table=253, priority=0 actions={NOTE.actions}\n"
    assert same_flows(dumped, [NOTE])
    assert not same_flows(dumped, [note_flow(b"\x02")])
    assert not same_flows("", [NOTE])


def test_the_fake_parses_add_flows_lines() -> None:
    parsed = parse_flow("cookie=0x5,table=20,priority=100,ip,in_port=3 actions=goto_table:21")
    assert (parsed.cookie, parsed.table, parsed.priority) == (5, 20, 100)
    assert (parsed.match, parsed.actions) == ("ip,in_port=3", "goto_table:21")
    for bad in ("table=1,priority=1,ip", "table=x,priority=1 actions=drop"):
        with pytest.raises(DataPlaneRejected):
            parse_flow(bad)


async def test_the_fake_dumps_one_table(switch: FakeFlowRunner) -> None:
    await switch.replace_flows("br0", "".join(f.text() + "\n" for f in desired()))
    assert same_flows(await switch.dump_flows("br0", "table=253"), [NOTE])
    assert len((await switch.dump_flows("br0")).splitlines()) == 6


def by_cookie(flows: list[Flow]) -> dict[int, list[Flow]]:
    found: dict[int, list[Flow]] = {}
    for flow in flows:
        found.setdefault(flow.cookie, []).append(flow)
    return found


async def test_groups_given_directly_send_only_what_changed(switch: FakeFlowRunner) -> None:
    """``sync_groups``: the same group objects again send nothing; an equal group in a
    new object (or in another order) is no change; one changed group is one bundle."""
    sync = FlowSync(switch)
    groups = by_cookie(desired())
    await sync.sync_groups(groups)
    switch.calls.clear()
    assert (await sync.sync_groups(dict(groups))).mode == "none"
    again = {c: list(reversed(fs)) for c, fs in groups.items()}
    assert (await sync.sync_groups(again)).mode == "none"
    changed = {**groups, POD_A: pod(POD_A, 3, 7)}
    result = await sync.sync_groups(changed)
    assert result.mode == "bundle" and result.groups == 1
    assert switch.calls == [
        ("bundle", "br0", bundle_text(groups, {POD_A: sorted(pod(POD_A, 3, 7))}, [POD_A]))
    ]
    assert sorted(switch.tables["br0"].values()) == sorted(f for fs in changed.values() for f in fs)


async def test_a_group_clashing_with_an_applied_one_is_refused_and_nothing_moves(
    switch: FakeFlowRunner,
) -> None:
    """Two flows matching alike across groups, where only one group changed: refused
    before anything is sent, and the known state stays (a later good sync is a bundle)."""
    sync = FlowSync(switch)
    groups = by_cookie(desired())
    await sync.sync_groups(groups)
    switch.calls.clear()
    clash = Flow(tables.CLASSIFY, 0, "", "drop", POD_B)  # NODE's match, in B's group
    with pytest.raises(DataPlaneRejected, match="match alike"):
        await sync.sync_groups({**groups, POD_B: [*groups[POD_B], clash]})
    with pytest.raises(DataPlaneRejected, match="without a cookie"):
        await sync.sync_groups({**groups, 0: [Flow(0, 0, "ip", "drop")]})
    assert switch.calls == []
    # the clash is fine once the group that held the match gives it up in the same sync
    moved = {**groups, NODE: [], POD_B: [*groups[POD_B], clash]}
    assert (await sync.sync_groups(moved)).mode == "bundle"
    assert [op for op, _, _ in switch.calls] == ["bundle"]
    back = await sync.sync_groups(groups)
    assert back.mode == "bundle" and back.groups == 2


async def test_after_forget_the_whole_table_is_checked_afresh(switch: FakeFlowRunner) -> None:
    """A match that moved to another group while the switch was forgotten is no clash
    with what was applied before."""
    sync = FlowSync(switch)
    await sync.sync_groups(by_cookie(desired()))
    sync.forget()
    moved = Flow(tables.CLASSIFY, 0, "", "drop", POD_B)
    flows = [f for f in desired() if f.cookie != NODE] + [moved]
    assert (await sync.sync_groups(by_cookie(flows))).mode == "replace"
    assert moved in switch.tables["br0"].values()
