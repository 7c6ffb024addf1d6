"""Parsing HAProxy's CLI answers: show proc, show stat, show servers state; stats totals."""

from __future__ import annotations

import pytest

from podnet.router.haproxy.driver import keep_server_states
from podnet.router.haproxy.runtimeapi import RuntimeAPIError, parse_show_proc
from podnet.router.haproxy.stats import BackendStats, StatsTotals, parse_show_stat

SHOW_PROC = """#<PID>          <type>          <reloads>       <uptime>        <version>
17050           master          2 [failed: 1]   0d00h12m17s     2.6.12-1+deb12u4
# workers
24844           worker          0               0d00h00m01s     2.6.12-1+deb12u4
# old workers
17177           worker          1               0d00h01m55s     2.6.12-1+deb12u4
# programs

"""

HEADER = "# pxname,svname,qcur,stot,econ,eresp,hrsp_5xx,req_tot,"
SHOW_STAT = "\n".join(
    [
        HEADER,
        "public,FRONTEND,0,100,,,3,100,",
        "be_http:ns1:web,ept:10.0.0.1:80,0,7,1,0,1,,",
        "be_http:ns1:web,BACKEND,0,9,1,2,3,12,",
        "be_tcp:ns1:pt,BACKEND,0,5,1,0,,,",
        "openshift_default,BACKEND,0,4,0,0,4,4,",
        "",
    ]
)


def test_show_proc():
    procs = parse_show_proc(SHOW_PROC)
    assert (procs.master_pid, procs.reloads, procs.failed_reloads) == (17050, 2, 1)
    assert procs.workers == (24844,) and procs.old_workers == (17177,)
    with pytest.raises(RuntimeAPIError):
        parse_show_proc("Unknown command.\n")


def test_show_stat_per_route_backend():
    stats = parse_show_stat(SHOW_STAT)
    assert stats == {
        "be_http:ns1:web": BackendStats("be_http:ns1:web", requests=12, errors=3),
        "be_tcp:ns1:pt": BackendStats("be_tcp:ns1:pt", requests=5, errors=1),
    }
    assert stats["be_tcp:ns1:pt"].route == "ns1:pt"


def test_totals_survive_a_new_worker_and_drop_removed_routes():
    totals = StatsTotals()
    web = "be_http:ns1:web"
    assert totals.add(1, {web: BackendStats(web, 10, 1)})[web] == BackendStats(web, 10, 1)
    assert totals.add(1, {web: BackendStats(web, 15, 2)})[web] == BackendStats(web, 15, 2)
    # a reload: the new worker counts from zero
    assert totals.add(2, {web: BackendStats(web, 3, 0)})[web] == BackendStats(web, 18, 2)
    assert totals.add(3, {}) == {}
    assert totals.add(4, {web: BackendStats(web, 1, 0)})[web] == BackendStats(web, 1, 0)


def test_server_states_drop_servers_put_in_maintenance():
    text = (
        "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state\n"
        "4 be_http:ns:a 1 ept:10.0.0.1:80 10.0.0.1 2 0 1 1\n"
        "4 be_http:ns:a 2 ept:10.0.0.2:80 10.0.0.2 0 1 1 1\n"
        "4 be_http:ns:a 3 ept:10.0.0.3:80 10.0.0.3 0 4 1 1\n"
    )
    kept = keep_server_states(text).splitlines()
    assert kept[0] == "1" and kept[1].startswith("# be_id")
    assert [line.split()[3] for line in kept[2:]] == ["ept:10.0.0.1:80", "ept:10.0.0.3:80"]
