"""The plan from the live table to the desired one, and the runtime commands it gives."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.router.haproxy import plan_update
from podnet.router.haproxy.plan import ServerChange, commands
from podnet.router.table import RouteBackend, RouterTable, Server

WEB = RouteBackend("ns1", "web", "w.example.com", servers=(Server("10.0.0.1", 80),))
PT = RouteBackend("ns1", "pt", "p.example.com", termination="passthrough")
RE = RouteBackend("ns1", "re", "r.example.com", termination="reencrypt", destination_ca_pem="CA")


def with_servers(route: RouteBackend, *servers: Server) -> RouteBackend:
    return dataclasses.replace(route, servers=servers)


def test_first_table_reloads_and_an_equal_one_changes_nothing():
    assert plan_update(None, RouterTable()).reload
    table = RouterTable(routes=(WEB,))
    assert plan_update(table, RouterTable(routes=(WEB,))).unchanged


def test_server_changes_go_to_the_runtime_api():
    old = RouterTable(routes=(with_servers(WEB, Server("10.0.0.1", 80), Server("10.0.0.2", 80)),))
    new_route = with_servers(WEB, Server("10.0.0.2", 80, weight=5), Server("10.0.0.3", 80))
    plan = plan_update(old, RouterTable(routes=(new_route,)))
    assert not plan.reload
    got = [(c.operation, c.server.name) for c in plan.changes]
    assert got == [
        ("remove", "ept:10.0.0.1:80"),
        ("weight", "ept:10.0.0.2:80"),
        ("add", "ept:10.0.0.3:80"),
    ]
    assert plan.changes[0].target == "be_http:ns1:web/ept:10.0.0.1:80"


def test_anything_else_reloads_with_reasons():
    table = RouterTable(routes=(WEB,))
    assert plan_update(table, RouterTable(routes=(WEB, PT))).reload_reasons == (
        "route ns1:pt added",
    )
    assert plan_update(RouterTable(routes=(WEB, PT)), table).reload_reasons == (
        "route ns1:pt removed",
    )
    changed = dataclasses.replace(WEB, path="/x", servers=())
    assert plan_update(table, RouterTable(routes=(changed,))).reload_reasons == (
        "route ns1:web changed",
    )
    certified = dataclasses.replace(WEB, termination="edge", certificate_pem="C")
    assert plan_update(table, RouterTable(routes=(certified,))).reload


def test_a_reencrypt_backend_getting_its_first_server_reloads():
    empty = RouterTable(routes=(RE,))
    first = RouterTable(routes=(with_servers(RE, Server("10.0.0.9", 8443)),))
    assert "first server" in plan_update(empty, first).reload_reasons[0]
    second = RouterTable(
        routes=(with_servers(RE, Server("10.0.0.9", 8443), Server("10.0.0.8", 8443)),)
    )
    assert not plan_update(first, second).reload


def test_commands_for_each_change():
    server = Server("10.0.0.3", 80, weight=2)
    add = commands(ServerChange("add", WEB, server), draining=False)
    assert [c.text for c in add] == [
        "add server be_http:ns1:web/ept:10.0.0.3:80 10.0.0.3:80 weight 2",
        "enable server be_http:ns1:web/ept:10.0.0.3:80",
        "enable dynamic-cookie backend be_http:ns1:web",
    ]
    assert add[0].success == ("New server registered.",)
    back = commands(ServerChange("add", WEB, server), draining=True)
    assert [c.text for c in back] == [
        "set server be_http:ns1:web/ept:10.0.0.3:80 weight 2",
        "set server be_http:ns1:web/ept:10.0.0.3:80 state ready",
    ]
    remove = commands(ServerChange("remove", WEB, server), draining=False)
    assert [c.text for c in remove] == [
        "set server be_http:ns1:web/ept:10.0.0.3:80 state maint",
        "del server be_http:ns1:web/ept:10.0.0.3:80",
    ]
    assert remove[1].optional and not remove[0].optional
    pt = commands(ServerChange("add", PT, server), draining=False)
    assert len(pt) == 2  # no cookie in TCP mode
    re_add = commands(ServerChange("add", RE, server), draining=False)[0].text
    assert re_add.endswith("ssl verify required ca-file cacerts/ns1:re.pem")


servers = st.lists(
    st.builds(
        Server,
        st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
        st.sampled_from([80, 81]),
        st.integers(0, 256),
    ),
    max_size=6,
    unique_by=lambda s: s.name,
)


@settings(deadline=None)  # no wall-clock limit on a shared machine
@given(before=servers, after=servers)
def test_applying_the_changes_gives_the_desired_servers(before: list[Server], after: list[Server]):
    plan = plan_update(
        RouterTable(routes=(with_servers(WEB, *before),)),
        RouterTable(routes=(with_servers(WEB, *after),)),
    )
    assert not plan.reload
    state = {s.name: s for s in before}
    for change in plan.changes:
        if change.operation == "remove":
            del state[change.server.name]
        else:
            assert (change.operation == "add") == (change.server.name not in state)
            state[change.server.name] = change.server
    assert state == {s.name: s for s in after}
    assert plan.unchanged == (sorted(before) == sorted(after))
